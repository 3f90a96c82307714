-- Move every worker whose heartbeat is older than the cutoff from `workers` to
-- `dead`, atomically, so that its heartbeat can no longer revive that id.
-- ARGV: cutoff, now. Returns the ids declared dead by this call.
local stale = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', '(' .. ARGV[1])
for _, worker in ipairs(stale) do
  redis.call('ZREM', KEYS[6], worker)
  redis.call('ZADD', KEYS[7], ARGV[2], worker)
end
return stale
