-- Move due ids from `scheduled` to their ready lists (the sweeper's share of
-- what every worker claim also does). ARGV: limit. Returns how many moved.
return promote(redis_now(), tonumber(ARGV[1]))
