-- A worker's round trip: forget the ids it has finished, promote due scheduled
-- ids, then move up to `count` ids into its processing list, high priority first.
-- KEYS[8] = this worker's processing list.
-- ARGV: now, count, promote_limit, n_acks, ack ids...
-- Returns a flat list: id1, prio1, id2, prio2, ...
local now = tonumber(ARGV[1])
local count = tonumber(ARGV[2])
local n_acks = tonumber(ARGV[4])
for i = 1, n_acks do
  redis.call('LREM', KEYS[8], -1, ARGV[4 + i])
end
promote(now, tonumber(ARGV[3]))
local out = {}
local taken = 0
for prio = 1, 3 do
  while taken < count do
    local id = redis.call('LMOVE', KEYS[2 + prio], KEYS[8], 'RIGHT', 'LEFT')
    if not id then break end
    redis.call('SREM', KEYS[1], id)
    out[#out + 1] = id
    out[#out + 1] = prio
    taken = taken + 1
  end
  if taken >= count then break end
end
return out
