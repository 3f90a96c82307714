-- Refresh a worker's heartbeat, but only while it is still registered: a worker
-- the sweeper has declared dead (or whose entry Redis lost) must not come back to
-- life under the same id. ARGV: now, worker id. Returns 1 if alive, 0 if not.
if redis.call('ZSCORE', KEYS[6], ARGV[2]) then
  redis.call('ZADD', KEYS[6], ARGV[1], ARGV[2])
  return 1
end
return 0
