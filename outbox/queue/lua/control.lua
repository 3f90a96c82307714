-- The operator's control hash (outbox/queue/control.py). Its own KEYS[1] = control:
--   created       Redis time the hash was (re)created: its generation
--   paused        set while all sending is paused (value: since when)
--   pause:<dom>   set while one recipient domain is paused (since when)
--   slow:<dom>    a domain held until this Redis time (its server said 421/450)
--   refused:<mailer>  a mailer paused because its ESP refused its credential (or
--                 its backend cannot be created): "<until> <count> <since> <why>",
--                 the count of pauses in a row; '' is the default mailer
--   lost_at       when a worker found the hash recreated after Redis lost it
-- ARGV[1] is the operation:
--   pause <domain or ''> | resume <domain or ''> | slow <domain> <seconds>
--   refuse <mailer> <first pause> <cap> <why> | accepted <mailer>
--   sync <generation the caller last saw, or ''> <fields to restore...>
--   read ''   (outbox_status, the dashboard, metrics: changes nothing)
-- Every operation but `read` creates the hash if it is missing (so that its
-- absence later means Redis lost it); each returns {Redis time, the hash as a
-- flat list}. `read` is a script rather than a pipeline with TIME because
-- redis-py refuses TIME in a cluster pipeline, and so that the time is that
-- of the primary holding the hash, the scripts' clock.
--
-- `refuse` starts a pause of the mailer unless one is running (threads and
-- workers that met the same refusal join it): each pause in a row lasts twice
-- the one before, up to the cap. Its reply has a third element, 1 when this
-- call started the pause (its caller logs it: once per pause). `accepted`
-- (a send through the mailer succeeded; its third element is 1 when there
-- was a pause to forget) and a global `resume` forget it.
--
-- `sync` is how a lost pause survives: a worker that saw generation G and now
-- finds the hash missing, or of another generation, writes back the pauses it
-- remembers and marks the loss. A pause is only ever restored, never dropped:
-- the safe default when Redis forgets is the state the workers last saw.
local now = redis_now()
local op = ARGV[1]
if op == 'read' then
  return {time_reply(now), redis.call('HGETALL', KEYS[1])}
end
local existed = redis.call('EXISTS', KEYS[1]) == 1
if not existed then
  redis.call('HSET', KEYS[1], 'created', time_reply(now))
end
if op == 'pause' then
  redis.call('HSET', KEYS[1], ARGV[2] == '' and 'paused' or ('pause:' .. ARGV[2]), time_reply(now))
elseif op == 'resume' then
  if ARGV[2] == '' then
    redis.call('HDEL', KEYS[1], 'paused', 'lost_at')
    local flat = redis.call('HGETALL', KEYS[1])
    for i = 1, #flat, 2 do
      if string.sub(flat[i], 1, 8) == 'refused:' then
        redis.call('HDEL', KEYS[1], flat[i])
      end
    end
  else
    redis.call('HDEL', KEYS[1], 'pause:' .. ARGV[2])
  end
elseif op == 'slow' then
  local field = 'slow:' .. ARGV[2]
  local untl = now + tonumber(ARGV[3])
  local old = tonumber(redis.call('HGET', KEYS[1], field) or '0')
  if untl > old then
    redis.call('HSET', KEYS[1], field, time_reply(untl))
  end
  -- Forget domains whose wait is over (the hash stays small).
  local flat = redis.call('HGETALL', KEYS[1])
  for i = 1, #flat, 2 do
    if string.sub(flat[i], 1, 5) == 'slow:' and tonumber(flat[i + 1]) <= now then
      redis.call('HDEL', KEYS[1], flat[i])
    end
  end
elseif op == 'refuse' then
  local field = 'refused:' .. ARGV[2]
  local old = redis.call('HGET', KEYS[1], field)
  local count = 0
  if old then
    local untl, n = string.match(old, '^(%S+) (%d+)')
    if tonumber(untl) > now then
      return {time_reply(now), redis.call('HGETALL', KEYS[1]), 0}
    end
    count = tonumber(n)
  end
  count = count + 1
  local seconds = math.min(tonumber(ARGV[4]), tonumber(ARGV[3]) * 2 ^ (count - 1))
  redis.call('HSET', KEYS[1], field,
    time_reply(now + seconds) .. ' ' .. count .. ' ' .. time_reply(now) .. ' ' .. ARGV[5])
  return {time_reply(now), redis.call('HGETALL', KEYS[1]), 1}
elseif op == 'accepted' then
  local forgot = redis.call('HDEL', KEYS[1], 'refused:' .. ARGV[2])
  return {time_reply(now), redis.call('HGETALL', KEYS[1]), forgot}
elseif op == 'sync' then
  local seen = ARGV[2]
  if seen ~= '' and redis.call('HGET', KEYS[1], 'created') ~= seen then
    for i = 3, #ARGV do
      redis.call('HSETNX', KEYS[1], ARGV[i], time_reply(now))
    end
    redis.call('HSET', KEYS[1], 'lost_at', time_reply(now))
  end
end
return {time_reply(now), redis.call('HGETALL', KEYS[1])}
