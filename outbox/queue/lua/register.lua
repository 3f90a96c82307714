-- Register a new incarnation with its first heartbeat. ARGV: incarnation.
-- Returns the Redis time.
local now = redis_now()
redis.call('ZADD', KEYS[6], now, ARGV[1])
return time_reply(now)
