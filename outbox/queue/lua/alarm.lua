-- The failure alarm (outbox/queue/alarm.py). Its own keys:
--   KEYS[1] alarm        hash: the window's tallies, in buckets of `width` seconds
--                        (bucket = floor(Redis time / width)):
--                          "<bucket>\ta\t<mailer>"          attempts
--                          "<bucket>\tf\t<mailer>"          failed attempts
--                          "<bucket>\tc\t<mailer>\t<cause>" failed attempts with that cause
--   KEYS[2] alarm-state  hash: mailer ('' the default one) -> "<since> <said> <cause>"
--                        while its alarm is on (`said`: when a worker last logged it)
-- ARGV: op, window, width, least, share; then, for `add`, per mailer:
--   mailer, attempts, failures, n, then n pairs (cause, count)
--   add   adds a worker's tallies, forgets buckets older than the window, and
--         moves the alarms on and off; each reply row carries the event a
--         worker logs: 'began', 'still' (the alarm was last said a window ago
--         or more), 'cleared', or ''. The state changes here, atomically, so
--         of all the workers exactly one gets each event.
--   read  the same sums, for outbox_status, the dashboard and the metrics;
--         changes nothing (the alarm is judged from the window alone).
-- A mailer's alarm is on while its failures in the window reach both `least`
-- and `share` of its attempts. Reply: {Redis time, rows}, one row per mailer
-- with attempts in the window or an alarm on:
--   {mailer, on (0/1), attempts, failures, cause, since (while on, or as it
--   clears) or '', event}
local now = redis_now()
local op = ARGV[1]
local window, width = tonumber(ARGV[2]), tonumber(ARGV[3])
local least, share = tonumber(ARGV[4]), tonumber(ARGV[5])
local bucket = math.floor(now / width)
local first = bucket - math.ceil(window / width) + 1
local ttl = math.ceil((2 * window + width) * 1000)

local function field(b, kind, mailer, cause)
  local name = string.format('%d', b) .. '\t' .. kind .. '\t' .. mailer
  if cause then name = name .. '\t' .. cause end
  return name
end

if op == 'add' then
  local i = 6
  while i <= #ARGV do
    local mailer = ARGV[i]
    local attempts, failures, n = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
    if attempts > 0 then redis.call('HINCRBY', KEYS[1], field(bucket, 'a', mailer), attempts) end
    if failures > 0 then redis.call('HINCRBY', KEYS[1], field(bucket, 'f', mailer), failures) end
    for j = 1, n do
      local at = i + 2 + 2 * j
      redis.call('HINCRBY', KEYS[1], field(bucket, 'c', mailer, ARGV[at]), tonumber(ARGV[at + 1]))
    end
    i = i + 4 + 2 * n
  end
  redis.call('PEXPIRE', KEYS[1], ttl)
end

-- The window's sums per mailer.
local sums, order = {}, {}
local function sum_of(mailer)
  local s = sums[mailer]
  if not s then
    s = {a = 0, f = 0, causes = {}}
    sums[mailer] = s
    order[#order + 1] = mailer
  end
  return s
end
local stale = {}
local flat = redis.call('HGETALL', KEYS[1])
for k = 1, #flat, 2 do
  local name = flat[k]
  local b, kind, rest = string.match(name, '^(%-?%d+)\t(%a)\t(.*)$')
  b = tonumber(b)
  if b == nil or b < first then
    stale[#stale + 1] = name
  elseif b <= bucket then
    local count = tonumber(flat[k + 1])
    if kind == 'c' then
      local mailer, cause = string.match(rest, '^([^\t]*)\t(.*)$')
      if mailer then
        local s = sum_of(mailer)
        s.causes[cause] = (s.causes[cause] or 0) + count
      end
    else
      local s = sum_of(rest)
      if kind == 'a' then s.a = s.a + count else s.f = s.f + count end
    end
  end
end
if op == 'add' then
  for k = 1, #stale, 500 do
    redis.call('HDEL', KEYS[1], unpack(stale, k, math.min(k + 499, #stale)))
  end
end

local state = {}
local states = redis.call('HGETALL', KEYS[2])
for k = 1, #states, 2 do
  state[states[k]] = states[k + 1]
  sum_of(states[k])
end

local rows = {}
for _, mailer in ipairs(order) do
  local s = sums[mailer]
  local cause, most = '', 0
  for text, count in pairs(s.causes) do
    if count > most or (count == most and text < cause) then cause, most = text, count end
  end
  local on = s.f > 0 and s.f >= least and s.f >= share * s.a
  local old = state[mailer]
  local since, event = '', ''
  if old then
    local was_since, was_said, was_cause = string.match(old, '^(%S+) (%S+) ?(.*)$')
    since = was_since
    if on and op == 'add' and now - tonumber(was_said) >= window then
      event = 'still'
      redis.call('HSET', KEYS[2], mailer, since .. ' ' .. time_reply(now) .. ' ' .. cause)
    elseif not on then
      if cause == '' then cause = was_cause end
      if op == 'add' then
        event = 'cleared'
        redis.call('HDEL', KEYS[2], mailer)
      end
    end
  elseif on then
    since = time_reply(now)
    if op == 'add' then
      event = 'began'
      redis.call('HSET', KEYS[2], mailer, since .. ' ' .. since .. ' ' .. cause)
    end
  end
  if s.a > 0 or on or old then
    local shown = (on or event == 'cleared') and since or ''
    rows[#rows + 1] = {mailer, on and 1 or 0, s.a, s.f, cause, shown, event}
  end
end
if op == 'add' and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return {time_reply(now), rows}
