-- Last in the script: the driver, for modes "c", "C", "p" and "u". Reads the
-- locals of args.lua (mode, now, monotonic, call_id, cost, costs, n, replayed), the
-- algorithm functions and the replay helpers, and the per-rule ARGV triples
-- (code, two parameters at ARGV[3i+2 .. 3i+4]). A lower-case code is a live
-- rule, an upper-case one a shadow rule. Mode "u" gives back and
-- returns { now, 0 }; mode "C" answers a call already recorded as a peek at
-- cost 0 with replayed = 1. Otherwise it decides every rule given in KEYS
-- first, records the request only if all of them (shadow rules excepted)
-- admit and a peek records nothing (the remaining of a rule that admitted a
-- request that does not go through is without the cost); returns { now, replayed, then allowed,
-- remaining, retry_after_us, reset_after_us per key }, or an error reply for
-- an unknown algorithm code.

if mode == 'u' then
  for i = 1, n do
    give_back(ARGV[3 * i + 2], KEYS[i], costs and costs[i] or cost, tonumber(ARGV[3 * i + 3]), call_id, ARGV[3 * i + 4])
  end
  return { now, 0 }
end

local dedupe = mode == 'C'
if dedupe then
  -- A re-sent call that was already applied is answered with the current
  -- state (a peek at cost 0), admitted, and records nothing: it cannot count twice.
  for i = 1, n do
    if seen(ARGV[3 * i + 2], KEYS[i], call_id, ARGV[3 * i + 4]) then
      replayed = 1
      mode = 'p'
      cost = 0
      costs = nil
      break
    end
  end
end

-- Sized up front for up to four rules (nil slots end the reply where the
-- rules' values end); more rules grow it.
local out = { now, replayed, 0, 0, 0, 0, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil }
-- Rules carry values from decision to commit, at 3i-2 .. 3i: a log its
-- header's state, extra and ids (see swl_decide); a token bucket
-- the micro-tokens left, the stamp and the state as read (false when absent);
-- a sliding window of counters its "ids" field as read (false when absent or
-- not read) and its oldest and newest sub-windows stored (false when none);
-- a period counter the end of its period and its state as read (false when
-- absent or over).
local held
-- A log's newest entry time, when deciding read it (rule i at [i]).
local newest_of
local all_pass = true
for i = 1, n do
  local code = ARGV[3 * i + 2]
  local cost = costs and costs[i] or cost
  -- A rule of cost 0 among per-rule costs: decided at 1, never recorded.
  local probe = costs and cost == 0
  if probe then
    cost = 1
  end
  local allowed, remaining, retry_after, reset_after
  if code == 'w' or code == 'W' then
    local hdr, extra, ids, newest
    allowed, remaining, retry_after, reset_after, hdr, extra, ids, newest =
      swl_decide(KEYS[i], now, cost, ARGV[3 * i + 3] + 0, ARGV[3 * i + 4] + 0, monotonic)
    held = held or { nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil }
    held[3 * i - 2] = hdr
    held[3 * i - 1] = extra
    held[3 * i] = ids
    if newest then
      newest_of = newest_of or {}
      newest_of[i] = newest
    end
  elseif code == 'b' or code == 'B' then
    local left, stamp, stored
    allowed, remaining, retry_after, reset_after, left, stamp, stored =
      tb_decide(KEYS[i], now, cost, tonumber(ARGV[3 * i + 3]), tonumber(ARGV[3 * i + 4]))
    held = held or {}
    held[3 * i - 2] = left
    held[3 * i - 1] = stamp
    held[3 * i] = stored or false
  elseif code == 'k' or code == 'K' then
    local ids, oldest, newest
    allowed, remaining, retry_after, reset_after, ids, oldest, newest =
      sw_decide(KEYS[i], now, cost, tonumber(ARGV[3 * i + 3]), ARGV[3 * i + 4])
    held = held or {}
    held[3 * i - 2] = ids
    held[3 * i - 1] = oldest or false
    held[3 * i] = newest or false
  elseif code == 'l' or code == 'L' then
    allowed, remaining, retry_after, reset_after =
      cc_decide(KEYS[i], now, cost, tonumber(ARGV[3 * i + 3]), tonumber(ARGV[3 * i + 4]))
  elseif code == 'f' or code == 'F' or code == 'q' or code == 'Q' then
    local end_us, stored
    allowed, remaining, retry_after, reset_after, end_us, stored =
      pc_decide(KEYS[i], now, cost, tonumber(ARGV[3 * i + 3]), pc_end(code, now, ARGV[3 * i + 4]))
    held = held or {}
    held[3 * i - 2] = end_us
    held[3 * i - 1] = stored
  else
    for j = 1, i - 1 do
      if ARGV[3 * j + 2] == 'w' or ARGV[3 * j + 2] == 'W' then
        swl_flush(KEYS[j], held[3 * j - 2], held[3 * j - 1], held[3 * j])
      end
    end
    return redis.error_reply('ERR throttlegate: unknown algorithm code ' .. tostring(code))
  end
  if probe and allowed == 1 then
    remaining = remaining + 1
  end
  out[4 * i - 1] = allowed
  out[4 * i] = remaining
  out[4 * i + 1] = retry_after
  out[4 * i + 2] = reset_after
  if allowed == 0 and code >= 'a' then
    all_pass = false
  end
end

-- Overrides and blocks (extensions.lua), for the rules that have them.
if ext then
  all_pass = ext_apply(out, all_pass)
end

-- A request that does not go through consumes nothing: a rule that would
-- have admitted it still has what it had (its remaining without the cost).
if not all_pass and cost > 0 then
  for i = 1, n do
    if out[4 * i - 1] == 1 then
      out[4 * i] = out[4 * i] + (costs and costs[i] or cost)
    end
  end
end

-- Reservations (reserve.lua): what each reserved rule takes beyond the cost.
local granted
if reserve_grant and all_pass and mode ~= 'p' then
  granted = reserve_grant(out, held)
end

if mode ~= 'p' and all_pass then
  local stored_id = nil
  if dedupe then
    stored_id = call_id
  end
  for i = 1, n do
    local cost = costs and costs[i] or cost
    -- A shadow rule that denied records nothing, nor does a rule of cost 0.
    if out[4 * i - 1] == 1 and cost > 0 then
      local code = ARGV[3 * i + 2]
      if code == 'w' or code == 'W' then
        swl_commit(KEYS[i], now, cost, out[4 * i + 2], ARGV[3 * i + 4], stored_id, held[3 * i - 2],
          held[3 * i - 1], held[3 * i], newest_of and newest_of[i])
      elseif code == 'k' or code == 'K' then
        sw_commit(KEYS[i], now, cost + (granted and granted[i] or 0), out[4 * i + 2], ARGV[3 * i + 4], stored_id, held[3 * i - 2],
          held[3 * i - 1] or nil, held[3 * i] or nil)
      elseif code == 'f' or code == 'F' or code == 'q' or code == 'Q' then
        pc_commit(KEYS[i], now, cost + (granted and granted[i] or 0), held[3 * i - 2], stored_id, held[3 * i - 1])
      elseif code == 'l' or code == 'L' then
        -- The lease id is the call id as sent (the caller's, or the one the
        -- core made), never its tag (replay.lua): release and extend name it.
        cc_commit(KEYS[i], now, cost, tonumber(ARGV[3 * i + 4]), ARGV[3], out[4 * i + 2])
      else
        tb_commit(KEYS[i], held[3 * i - 1], held[3 * i - 2], out[4 * i + 2], stored_id, held[3 * i] or nil)
      end
    elseif ARGV[3 * i + 2] == 'w' or ARGV[3 * i + 2] == 'W' then
      swl_flush(KEYS[i], held[3 * i - 2], held[3 * i - 1], held[3 * i])
    end
  end
elseif uses_log then
  -- Nothing recorded: a log whose deciding dropped entries gets its header back.
  for i = 1, n do
    if ARGV[3 * i + 2] == 'w' or ARGV[3 * i + 2] == 'W' then
      swl_flush(KEYS[i], held[3 * i - 2], held[3 * i - 1], held[3 * i])
    end
  end
end
-- Reservations (reserve.lua): a log's entry and a bucket's list, then four
-- values per rule after everything else.
if granted then
  reserve_commit(granted, held)
end
if reserve_tail then
  for i = 1, 4 * n do
    out[#out + 1] = reserve_tail[i]
  end
end
return out
