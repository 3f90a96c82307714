-- Give back ids a worker claimed but never marked processing, and optionally
-- deregister it. KEYS[8] = its processing list.
-- ARGV: now, worker id, deregister (0/1), n_acks, ack ids..., then (id, prio, due) triples.
local now = tonumber(ARGV[1])
local n_acks = tonumber(ARGV[4])
for i = 1, n_acks do
  redis.call('LREM', KEYS[8], -1, ARGV[4 + i])
end
local first = 5 + n_acks
for i = first, #ARGV, 3 do
  redis.call('LREM', KEYS[8], -1, ARGV[i])
end
local pushed = push_args(first, now)
if ARGV[3] == '1' then
  redis.call('DEL', KEYS[8])
  redis.call('ZREM', KEYS[6], ARGV[2])
end
return pushed
