-- Move every incarnation whose heartbeat is older than `timeout` seconds (by
-- Redis time) from `workers` to `dead`, atomically, so that neither its
-- heartbeat nor its claims can revive it.
-- ARGV: timeout. Returns the incarnations declared dead by this call.
local now = redis_now()
local stale = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', '(' .. (now - tonumber(ARGV[1])))
for _, worker in ipairs(stale) do
  redis.call('ZREM', KEYS[6], worker)
  redis.call('ZADD', KEYS[7], now, worker)
end
return stale
