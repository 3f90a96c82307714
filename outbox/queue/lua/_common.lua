-- Shared by every outbox script; prepended to each one when it is loaded.
-- Every script receives the same keys, all under one hash tag:
--   KEYS[1] queued    set   ids waiting in a ready list or in `scheduled` (dedup gate)
--   KEYS[2] scheduled zset  member "id:prio", score = due time (epoch seconds)
--   KEYS[3] ready:high, KEYS[4] ready:normal, KEYS[5] ready:low   lists (LPUSH in, pop RIGHT)
--   KEYS[6] workers   zset  worker incarnation -> last heartbeat (Redis time)
--   KEYS[7] dead      zset  incarnation -> when it was declared dead (sweeper work list)
--   KEYS[8] wake      list  tokens that wake blocked workers (BLPOP): ids are ready, or one
--                           was scheduled earlier than any before it
--   KEYS[9] processing:<incarnation>  list (only for scripts about one worker)
--   KEYS[10] claims:<incarnation>     hash thread -> "nonce|acks applied|id,prio,..." (its last claim)
-- Priorities are 1 (high), 2 (normal), 3 (low); the ready list is KEYS[2 + prio].
--
-- The one clock: every time these scripts compare or record comes from Redis'
-- own TIME, never from the caller's clock, so a worker or sweeper host whose
-- clock is off cannot make a heartbeat look old or a scheduled id look due.

local WAKE_CAP = 64

local function redis_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- Lua numbers become integers in a Redis reply: times go back as strings.
local function time_reply(now)
  return string.format('%.6f', now)
end

-- Leave up to WAKE_CAP tokens for blocked workers after `n` ids became ready.
local function wake(n)
  if n > 0 then
    local tokens = {}
    for i = 1, math.min(n, WAKE_CAP) do tokens[i] = '1' end
    redis.call('LPUSH', KEYS[8], unpack(tokens))
    redis.call('LTRIM', KEYS[8], 0, WAKE_CAP - 1)
  end
end

-- Put one id where its due time says. Returns 1 if it went to a ready list.
local function place(id, prio, due, now)
  if due <= now then
    redis.call('LPUSH', KEYS[2 + prio], id)
    return 1
  end
  redis.call('ZADD', KEYS[2], due, id .. ':' .. prio)
  return 0
end

-- Mirror one row into Redis; returns (1 if new to the set, 1 if made ready).
-- A scheduled entry of the id for another time or priority is replaced by the
-- row's, so a requeue never waits for an old schedule. Otherwise an id already
-- in the set is waiting (in a ready list, or scheduled as asked) and is not
-- pushed twice, unless `force`: the caller knows the id is in no ready list
-- (it came out of a processing list, or a full check found it missing) and
-- the set must not be trusted.
-- An id new to the set is placed without looking at `scheduled`: every script
-- that schedules an id adds it to the set first, and only a claim (from a
-- ready list) or forget_stale (of an id waiting nowhere) takes one out. The
-- one gap: a duplicate claimed from a ready list while its twin waits in
-- `scheduled`. That twin stays, an early duplicate; the worker that claims
-- it finds the row not due and schedules it again at the row's time.
local function push(id, prio, due, now, force)
  -- Without `force` the set is asked once: past this point the id was in it.
  local added = 0
  if not force then
    added = redis.call('SADD', KEYS[1], id)
    if added == 1 then
      return 1, place(id, prio, due, now)
    end
  end
  local moved = false
  for p = 1, 3 do
    local member = id .. ':' .. p
    local score = redis.call('ZSCORE', KEYS[2], member)
    if score then
      if p == prio and tonumber(score) == due and not force then
        return 0, 0  -- already scheduled exactly so
      end
      redis.call('ZREM', KEYS[2], member)
      moved = true
    end
  end
  if force then
    added = redis.call('SADD', KEYS[1], id)
  end
  if force or moved then
    return added, place(id, prio, due, now)
  end
  return 0, 0
end

-- When the earliest scheduled id falls due (math.huge: none is scheduled).
local function earliest_scheduled()
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  return first[2] and tonumber(first[2]) or math.huge
end

-- Push ARGV triples (id, prio, due) starting at ARGV[first]; wakes workers.
-- An idle worker blocks only until the earliest scheduled id falls due (it
-- asks before it blocks), so an id scheduled earlier than that wakes one
-- worker too, to block again for the shorter time.
-- Returns how many ids were new to the set.
local function push_args(first, now, force)
  local added, readied = 0, 0
  -- Only an id placed in `scheduled` can make the earliest scheduled time
  -- earlier: without one, neither look at `scheduled` is needed.
  local earliest = nil
  for i = first + 2, #ARGV, 3 do
    if tonumber(ARGV[i]) > now then
      earliest = earliest_scheduled()
      break
    end
  end
  for i = first, #ARGV, 3 do
    local a, r = push(ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), now, force)
    added = added + a
    readied = readied + r
  end
  if readied == 0 and earliest and earliest_scheduled() < earliest then
    readied = 1
  end
  wake(readied)
  return added
end

-- Move up to `limit` due ids from `scheduled` into their ready lists.
local function promote(now, limit)
  local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
  for _, member in ipairs(due) do
    redis.call('ZREM', KEYS[2], member)
    local sep = string.find(member, ':', 1, true)
    redis.call('LPUSH', KEYS[2 + tonumber(string.sub(member, sep + 1))], string.sub(member, 1, sep - 1))
  end
  wake(#due)
  return #due
end
