-- Refresh an incarnation's heartbeat, but only while it is still registered: one
-- the sweeper has declared dead (or whose entry Redis lost) must not come back
-- to life. ARGV: incarnation. Returns: Redis time, 1 if alive or 0 if not.
local now = redis_now()
if redis.call('ZSCORE', KEYS[6], ARGV[1]) then
  redis.call('ZADD', KEYS[6], now, ARGV[1])
  return {time_reply(now), 1}
end
return {time_reply(now), 0}
