-- Shared by every outbox script; prepended to each one when it is loaded.
-- Every script receives the same keys, all under one hash tag:
--   KEYS[1] queued    set   ids waiting in a ready list or in `scheduled` (dedup gate)
--   KEYS[2] scheduled zset  member "id:prio", score = due time (epoch seconds)
--   KEYS[3] ready:high, KEYS[4] ready:normal, KEYS[5] ready:low   lists (LPUSH in, pop RIGHT)
--   KEYS[6] workers   zset  worker id -> last heartbeat
--   KEYS[7] dead      zset  worker id -> when it was declared dead (sweeper work list)
--   KEYS[8] processing:<worker> list (only for scripts about one worker)
-- Priorities are 1 (high), 2 (normal), 3 (low); the ready list is KEYS[2 + prio].

-- Put one id in Redis unless it is already waiting there. Returns 1 when pushed.
local function push(id, prio, due, now)
  if redis.call('SADD', KEYS[1], id) == 1 then
    if due <= now then
      redis.call('LPUSH', KEYS[2 + prio], id)
    else
      redis.call('ZADD', KEYS[2], due, id .. ':' .. prio)
    end
    return 1
  end
  return 0
end

-- Push ARGV triples (id, prio, due) starting at ARGV[first]. Returns how many were new.
local function push_args(first, now)
  local pushed = 0
  for i = first, #ARGV, 3 do
    pushed = pushed + push(ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), now)
  end
  return pushed
end

-- Move up to `limit` due ids from `scheduled` into their ready lists.
local function promote(now, limit)
  local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
  for _, member in ipairs(due) do
    redis.call('ZREM', KEYS[2], member)
    local sep = string.find(member, ':', 1, true)
    redis.call('LPUSH', KEYS[2 + tonumber(string.sub(member, sep + 1))], string.sub(member, 1, sep - 1))
  end
  return #due
end
