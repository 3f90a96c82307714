-- Mirror rows into Redis. ARGV: force (0/1), then (id, prio, due) triples.
-- Returns how many ids were new to the dedup set.
return push_args(2, redis_now(), ARGV[1] == '1')
