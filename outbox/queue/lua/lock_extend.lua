-- Extend a lock's lease only if this holder still owns it.
-- KEYS[1] lock, ARGV[1] token, ARGV[2] lease in milliseconds.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
