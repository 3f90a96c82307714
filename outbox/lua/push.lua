-- Mirror rows into Redis. ARGV: now, then (id, prio, due) triples.
-- Returns how many ids were not already waiting in Redis.
return push_args(2, tonumber(ARGV[1]))
