-- The one script behind every check and peek: decides every rule given in
-- KEYS first, and writes only if all of them (shadow rules excepted) admit.
--
-- ARGV[1] mode: "c" check (consume on success), "p" peek (never writes), or
--         "u" undo: give back what the check with this call id consumed
--         (Redis Cluster, when another slot of the same check denied it)
-- ARGV[2] now in microseconds, or "" to read the server clock with TIME
-- ARGV[3] call id (random per call, made by the client)
-- ARGV[4] cost (integer >= 1)
-- ARGV[5] "1" when the call id must be looked up first, because this call may
--         be a re-send of one that Redis already executed; else "0"
-- then for each key, 4 values:
--   "w", limit, window_us, shadow ("1"/"0")        sliding window log
--   "b", capacity, refill_rate, shadow ("1"/"0")   token bucket
--
-- Returns { now, replayed (0/1), then per key: allowed (0/1), remaining,
-- retry_after_us, reset_after_us }. All values are integers.

local mode = ARGV[1]
local now
-- The server's clock only moves forward (barring a wall-clock step on the
-- server), which spares a lookup per sliding-window admission.
local monotonic = ARGV[2] == ''
if monotonic then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[2])
end
local call_id = ARGV[3]
local cost = tonumber(ARGV[4])
local dedupe = ARGV[5] == '1'
local replayed = 0

if mode == 'u' then
  for i = 1, #KEYS do
    local base = 5 + (i - 1) * 4
    if ARGV[base + 1] == 'w' then
      swl_undo(KEYS[i], cost, call_id)
    else
      tb_undo(KEYS[i], cost, tonumber(ARGV[base + 2]), call_id)
    end
  end
  return { now, 0 }
end

if dedupe then
  -- A re-sent call that was already applied is answered with the current
  -- state (a peek at cost 0), admitted, and writes nothing: it cannot count twice.
  for i = 1, #KEYS do
    local algo = ARGV[5 + (i - 1) * 4 + 1]
    local seen
    if algo == 'w' then
      seen = swl_seen(KEYS[i], call_id)
    else
      seen = tb_seen(KEYS[i], call_id)
    end
    if seen then
      replayed = 1
      mode = 'p'
      cost = 0
      break
    end
  end
end

local out = { now, replayed }
local pending = {}
local all_pass = true
for i = 1, #KEYS do
  local base = 5 + (i - 1) * 4
  local algo = ARGV[base + 1]
  local p1 = tonumber(ARGV[base + 2])
  local p2 = tonumber(ARGV[base + 3])
  local shadow = ARGV[base + 4] == '1'
  local allowed, remaining, retry_after, reset_after, state, stamp, previous
  if algo == 'w' then
    allowed, remaining, retry_after, reset_after, state = swl_decide(KEYS[i], now, cost, p1, p2, monotonic)
  elseif algo == 'b' then
    allowed, remaining, retry_after, reset_after, state, stamp, previous = tb_decide(KEYS[i], now, cost, p1, p2)
  else
    return redis.error_reply('ERR throttlegate: unknown algorithm code ' .. tostring(algo))
  end
  out[#out + 1] = allowed
  out[#out + 1] = remaining
  out[#out + 1] = retry_after
  out[#out + 1] = reset_after
  pending[i] = { algo, p2, allowed, state, reset_after, stamp, previous }
  if allowed == 0 and not shadow then
    all_pass = false
  end
end

if mode == 'c' and all_pass then
  local stored_id = nil
  if dedupe then
    stored_id = call_id
  end
  for i = 1, #KEYS do
    local p = pending[i]
    if p[3] == 1 then
      if p[1] == 'w' then
        swl_commit(KEYS[i], now, cost, p[2], p[5], call_id)
      else
        tb_commit(KEYS[i], p[6], p[4], p[5], stored_id, p[7])
      end
    end
  end
end
return out
