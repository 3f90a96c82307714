-- Drop ids from the dedup set that wait nowhere: not in `scheduled` and in no
-- ready list (Redis lost the list, or an older release left them). Only the
-- full mirror check calls this, for the few ids its scan did not find.
-- ARGV: ids. Returns how many were dropped.
local dropped = 0
for _, id in ipairs(ARGV) do
  if redis.call('SISMEMBER', KEYS[1], id) == 1
      and redis.call('ZSCORE', KEYS[2], id .. ':1') == false
      and redis.call('ZSCORE', KEYS[2], id .. ':2') == false
      and redis.call('ZSCORE', KEYS[2], id .. ':3') == false
      and redis.call('LPOS', KEYS[3], id) == false
      and redis.call('LPOS', KEYS[4], id) == false
      and redis.call('LPOS', KEYS[5], id) == false then
    redis.call('SREM', KEYS[1], id)
    dropped = dropped + 1
  end
end
return dropped
