-- Finish with a dead incarnation: push back the ids the sweeper decided to
-- requeue (forced: they came out of its processing list, so the dedup set says
-- nothing about them), drop its processing list, its claim record and its
-- entry in `dead`. ARGV: incarnation, then (id, prio, due) triples.
-- Returns how many were pushed.
local pushed = push_args(2, redis_now(), true)
redis.call('DEL', KEYS[9], KEYS[10])
redis.call('ZREM', KEYS[7], ARGV[1])
return pushed
