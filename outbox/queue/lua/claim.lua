-- A worker thread's round trip: forget the ids it has finished, promote due
-- scheduled ids, then move up to `count` ids into its processing list, high
-- priority first, taking them out of the dedup set in the same step.
-- ARGV: incarnation, count, promote_limit, thread, nonce, share, ack ids ("id,id,...").
--
-- `share`: how many threads the backlog is shared among (the caller's
-- worker process). A thread takes at most its fair part of what is ready,
-- ceil(ready / share), and at least one id: a short backlog is spread over
-- idle threads instead of waiting behind one thread's sends (with a 20 ms
-- server, the tenth id of a batch of ten waited ~200 ms), while a long one is
-- still claimed `count` at a time.
-- Returns: Redis time, registered (1/0), then only when registered the control
-- hash (flat field/value list) and the ids claimed, "id1,prio1,id2,prio2,...";
-- when it claimed none (not paused, not a replay), fifth the due time of the
-- earliest scheduled id ('' if none), which an idle thread blocks until: the
-- same look it would otherwise make in a round trip of its own.
-- The acks and the ids travel as one string each, not an element per id: the
-- client's encoding and parsing of each element cost more than the script.
-- KEYS[11] is the operator's control hash (outbox/queue/control.py): it rides along
-- with every reply, and while it says `paused` no id is handed out.
--
-- Registration is checked first: an incarnation the sweeper declared dead must
-- not claim into a list that nobody will reap (its acks do not matter then:
-- the sweeper reaps the whole list).
--
-- A retry with the nonce of a claim whose reply was lost gets that claim's ids
-- again instead of new ones, so no id hides in the processing list for the
-- worker's lifetime. Acks are applied exactly once across such retries: the
-- caller only appends to its acks while a nonce is unanswered, and the record
-- "nonce|applied|id,prio,..." says how many of them a try already applied, so
-- a replay applies only those added since. An ack applied twice could remove
-- the twin of an id another thread of this incarnation has just claimed.
local now = redis_now()
if not redis.call('ZSCORE', KEYS[6], ARGV[1]) then
  return {time_reply(now), 0}
end
local out = {time_reply(now), 1, redis.call('HGETALL', KEYS[11])}
local acks = {}
for ack in string.gmatch(ARGV[7], '[^,]+') do
  acks[#acks + 1] = ack
end
local n_acks = #acks
local function apply_acks(from)
  for i = from + 1, n_acks do
    redis.call('LREM', KEYS[9], -1, acks[i])
  end
end
-- An empty nonce (a caller that never retries) neither replays nor is recorded.
local last = ARGV[5] ~= '' and redis.call('HGET', KEYS[10], ARGV[4])
if last then
  local sep = string.find(last, '|', 1, true)
  if string.sub(last, 1, sep - 1) == ARGV[5] then
    local sep2 = string.find(last, '|', sep + 1, true)
    local applied = tonumber(string.sub(last, sep + 1, sep2 - 1))
    local ids = string.sub(last, sep2 + 1)
    if n_acks > applied then
      apply_acks(applied)
      redis.call('HSET', KEYS[10], ARGV[4], ARGV[5] .. '|' .. n_acks .. '|' .. ids)
    end
    out[4] = ids
    return out
  end
end
apply_acks(0)
if redis.call('HEXISTS', KEYS[11], 'paused') == 1 then
  -- Paused by the operator: hand out nothing (outbox_resume ends it). Still
  -- recorded, so that a retry after a lost reply does not apply its acks again.
  if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[10], ARGV[4], ARGV[5] .. '|' .. n_acks .. '|')
  end
  out[4] = ''
  return out
end
promote(now, tonumber(ARGV[3]))
local count = tonumber(ARGV[2])
local share = tonumber(ARGV[6])
if share > 1 and count > 1 then
  local ready = redis.call('LLEN', KEYS[3]) + redis.call('LLEN', KEYS[4])
    + redis.call('LLEN', KEYS[5])
  count = math.max(1, math.min(count, math.ceil(ready / share)))
end
local taken = {}  -- id1, prio1, id2, prio2, ...
local n = 0
for prio = 1, 3 do
  while n < count do
    local id = redis.call('LMOVE', KEYS[2 + prio], KEYS[9], 'RIGHT', 'LEFT')
    if not id then break end
    redis.call('SREM', KEYS[1], id)
    taken[#taken + 1] = id
    taken[#taken + 1] = prio
    n = n + 1
  end
  if n >= count then break end
end
local ids = table.concat(taken, ',')
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[10], ARGV[4], ARGV[5] .. '|' .. n_acks .. '|' .. ids)
end
if n < count then
  -- Nothing is left to take: no token may wake a worker for nothing.
  redis.call('DEL', KEYS[8])
end
out[4] = ids
if n == 0 then
  local earliest = earliest_scheduled()
  out[5] = earliest == math.huge and '' or time_reply(earliest)
end
return out
