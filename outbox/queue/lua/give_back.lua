-- Give back ids a worker claimed but never marked processing (forced push:
-- they were in its processing list), and optionally deregister it.
-- ARGV: incarnation, deregister (0/1), n_acks, ack ids..., then (id, prio, due) triples.
--
-- Deregistering never deletes ids: if the processing list still holds some
-- (an outcome the database would not take, a give-back that failed earlier),
-- the incarnation goes to `dead` instead, so the sweeper settles them.
local now = redis_now()
local n_acks = tonumber(ARGV[3])
for i = 1, n_acks do
  redis.call('LREM', KEYS[9], -1, ARGV[3 + i])
end
local first = 4 + n_acks
for i = first, #ARGV, 3 do
  redis.call('LREM', KEYS[9], -1, ARGV[i])
end
local pushed = push_args(first, now, true)
if ARGV[2] == '1' then
  redis.call('ZREM', KEYS[6], ARGV[1])
  if redis.call('LLEN', KEYS[9]) == 0 then
    redis.call('DEL', KEYS[9], KEYS[10])
  else
    redis.call('ZADD', KEYS[7], now, ARGV[1])
  end
end
return pushed
