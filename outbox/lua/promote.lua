-- Move due ids from `scheduled` to their ready lists (the sweeper's share of
-- what every worker claim also does). ARGV: now, limit. Returns how many moved.
return promote(tonumber(ARGV[1]), tonumber(ARGV[2]))
