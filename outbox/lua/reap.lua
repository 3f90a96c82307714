-- Finish with a dead worker: push back the ids the sweeper decided to requeue,
-- drop its processing list and its entry in `dead`. KEYS[8] = its processing list.
-- ARGV: now, worker id, then (id, prio, due) triples. Returns how many were pushed.
local pushed = push_args(3, tonumber(ARGV[1]))
redis.call('DEL', KEYS[8])
redis.call('ZREM', KEYS[7], ARGV[2])
return pushed
