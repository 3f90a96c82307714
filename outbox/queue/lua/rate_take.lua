-- Take a slot of each rate limit a message must pass (outbox/queue/ratelimit.py).
-- Its own KEYS, one pair per limit: the domain's, the mailer's ("mailer:<alias>"), then "*":
--   KEYS[2i-1] rate:<key>       hash: tat (the limit's next free slot, Redis time),
--                               sent (the same clock kept by actual sends), win
--                               and used (sends in the current period)
--   KEYS[2i]   rate-held:<key>  zset: id -> the slot this limit reserved for it
-- ARGV: id, then per limit: interval (period / count), period; seconds.
-- Returns {Redis time, 0} when the message may be sent now, else {Redis time, slot}.
--
-- GCRA with no burst: slots under one limit are `interval` apart. A second
-- GCRA clock, `sent`, is kept by the sends themselves, with a tolerance of
-- CATCH_UP periods: a backlog whose slots came while the workers lagged (a
-- burst of refusals, a loaded host) may run ahead of the spacing by that much
-- and no more; a message beyond it takes a new slot at the end, so over any
-- period at most count * (1 + CATCH_UP) + 1 sends go out. A busy limit reserves its next free slot
-- for the message (tat moves on by one interval) and nothing else is taken:
-- the other limits are not consumed. A slot whose time has come is the
-- message's: that limit counts as paid when it comes back, and the remaining
-- limits are checked then. Reservations older than HELD_GRACE are forgotten
-- (their message went elsewhere: cancelled, sent by another path).
local HELD_GRACE = 3600
local CATCH_UP = 0.1
local now = redis_now()
local id = ARGV[1]
local n = #KEYS / 2
local paid = {}
for i = 1, n do
  redis.call('ZREMRANGEBYSCORE', KEYS[2 * i], '-inf', '(' .. (now - HELD_GRACE))
  local slot = redis.call('ZSCORE', KEYS[2 * i], id)
  if slot then
    slot = tonumber(slot)
    if slot > now then
      return {time_reply(now), time_reply(slot)}  -- back early: keep waiting for it
    end
    paid[i] = true
  end
end
local function keep(i, tat)
  local period = tonumber(ARGV[2 * i + 1])
  redis.call('HSET', KEYS[2 * i - 1], 'tat', time_reply(tat))
  redis.call('PEXPIRE', KEYS[2 * i - 1], math.ceil((tat - now + period) * 1000))
end
for i = 1, n do
  local interval = tonumber(ARGV[2 * i])
  local state = redis.call('HMGET', KEYS[2 * i - 1], 'tat', 'sent')
  local tat = tonumber(state[1] or '0')
  local ahead = tonumber(state[2] or '0') - CATCH_UP * tonumber(ARGV[2 * i + 1])
  -- Busy: no free slot yet (a paid slot skips this test), or the sends have
  -- run ahead of the spacing by the whole tolerance.
  if (not paid[i] and tat > now) or ahead > now then
    local slot = math.max(tat, ahead)
    keep(i, slot + interval)
    redis.call('ZADD', KEYS[2 * i], slot, id)
    return {time_reply(now), time_reply(slot)}
  end
end
for i = 1, n do
  if not paid[i] then
    keep(i, now + tonumber(ARGV[2 * i]))
  end
  redis.call('ZREM', KEYS[2 * i], id)
  local sent = tonumber(redis.call('HGET', KEYS[2 * i - 1], 'sent') or '0')
  redis.call('HSET', KEYS[2 * i - 1], 'sent', time_reply(math.max(sent, now) + tonumber(ARGV[2 * i])))
  local window = math.floor(now / tonumber(ARGV[2 * i + 1]))
  if tonumber(redis.call('HGET', KEYS[2 * i - 1], 'win') or '-1') ~= window then
    redis.call('HSET', KEYS[2 * i - 1], 'win', window, 'used', 0)
  end
  redis.call('HINCRBY', KEYS[2 * i - 1], 'used', 1)
  if redis.call('PTTL', KEYS[2 * i - 1]) < 0 then
    redis.call('PEXPIRE', KEYS[2 * i - 1], math.ceil(tonumber(ARGV[2 * i + 1]) * 1000))
  end
end
return {time_reply(now), '0'}
