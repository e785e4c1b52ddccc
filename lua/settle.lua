-- Eighth in the script, before the driver: mode "x", settling a check whose
-- real cost is known only after it ran. Reads `mode`, `now`, `call_id` (the
-- call's tag, replay.lua), `n` (args.lua), `tb_wait` (token_bucket.lua),
-- `sw_spec` (sliding_window.lua), `swl_head` / `swl_entry`
-- (sliding_window_log.lua) and `ids_take` / `ids_of` / `counter_id` /
-- `drop_counter_window` / `log_check_time` / `log_rewrite` (replay.lua), and
-- answers mode "x" itself, returning before check.lua runs; in every other
-- mode it defines nothing.
--
-- ARGV[4] is "<estimate>:<actual>": the cost the check `call_id` was made
-- with and the cost it really had. Per key, the usual three arguments. Each
-- rule is settled as if the check had cost `actual` from the start (capped
-- at the rule's limit or capacity), for as long as the check's units still
-- count there, and only once: the call's entry among the key's recent ids
-- is found and marked settled ("!" after its tag), so a second settle finds
-- it marked and changes nothing.
--
--   log      the header's ids must hold the call with a time still in the
--            window, and its entry "<t>:<estimate>" must be stored: it
--            becomes "<t>:<actual>" (removed at 0), the header's extra with it.
--   bucket   the id must be in the bucket's list; the difference goes back
--            (capped at the capacity) or comes off, and the micro-tokens may
--            go below zero: a debit beyond the capacity is waited off at the
--            refill rate. The key expires when the bucket would be full.
--   counters the id must be in `ids` with a sub-window that still counts;
--            the difference is added to or taken from that sub-window (at
--            most its units are taken), the key deleted when nothing is left.
--   period   the id must be in the list of the period that still runs; the
--            difference is added to or taken from its units (down to zero,
--            the key then deleted, as for a give-back).
--
-- Returns { now, 0, then per key 1 when the rule was settled, -1 when the
-- call is not found and the key's list holds 64 entries that still count
-- (newer calls' ids pushed it out: the core answers an error naming it),
-- 0 otherwise }.

if mode == 'x' then
  local estimate_s, actual_s = string.match(ARGV[4], '^(%d+):(%d+)$')
  local estimate, actual = tonumber(estimate_s), tonumber(actual_s)
  local settled_id = call_id .. '!'

  -- The answer for a rule whose list of ids `list` does not hold the call:
  -- 0 when it holds it marked settled, or fewer than 64 entries that `live`
  -- (when given; an entry's time or sub-window still counts) accepts;
  -- -1 when it holds 64: the call may have been pushed out by newer ones,
  -- and nothing can tell its units apart any more.
  local function lost(list, live)
    local held = 0
    for e in string.gmatch(list or '', '[^,]+') do
      local at = string.find(e, '[@:]')
      if string.sub(e, (at or 0) + 1) == settled_id then
        return 0
      end
      if live == nil or live(e) then
        held = held + 1
      end
    end
    if held >= 64 then
      return -1
    end
    return 0
  end

  local function settle_log(key, a, window)
    local t, extra, ids = log_check_time(key, call_id, window)
    if t == nil then
      local _, all = swl_head(key, false)
      return lost(all, function(e)
        return tonumber(string.match(e, '^(%d+)')) + window > now
      end)
    end
    local entry = swl_entry(t, estimate)
    if a == 0 then
      if redis.call('LREM', key, 1, entry) == 0 then
        return 0
      end
      extra = extra - (estimate - 1)
    else
      local at = redis.call('LPOS', key, entry)
      if not at then
        return 0
      end
      if a ~= estimate then
        redis.call('LSET', key, at, swl_entry(t, a))
      end
      extra = extra + a - estimate
    end
    log_rewrite(key, extra, ids, t, call_id, true)
    return 1
  end

  local function settle_bucket(key, a, capacity, rate)
    local stored = redis.call('GET', key)
    if not stored then
      return 0
    end
    local tk, ts = string.match(stored, '^(-?%d+):(%d+)')
    local found, list = ids_take(ids_of(stored), call_id, settled_id)
    if not found then
      return lost(ids_of(stored))
    end
    local full = capacity * 1000000
    local tokens = tonumber(tk) + (estimate - a) * 1000000
    if tokens > full then
      tokens = full
    end
    local stamp = tonumber(ts)
    local value = string.format('%d:%d', tokens, stamp)
    if list then
      value = value .. ':' .. list
    end
    local ttl = stamp + tb_wait(full - tokens, rate) - now
    redis.call('SET', key, value, 'PX', math.max(1, math.ceil(ttl / 1000)))
    return 1
  end

  local function settle_counters(key, a, spec)
    local ids, j = counter_id(key, call_id, spec)
    if j == nil then
      local window, precision = sw_spec(spec)
      local first = floor_div(now - window, precision)
      return lost(ids, function(e)
        return tonumber(string.match(e, '^(%d+)')) >= first
      end)
    end
    local _, list = ids_take(ids, j .. ':' .. call_id, j .. ':' .. settled_id)
    local delta = a - estimate
    if delta < 0 then
      local units = tonumber(redis.call('HGET', key, j)) or 0
      if -delta > units then
        delta = -units
      end
    end
    if redis.call('HINCRBY', key, 't', delta) <= 0 then
      -- Nothing is left: no state, as a check that never happened leaves none.
      redis.call('DEL', key)
      return 1
    end
    sw_ids_put(key, list)
    if redis.call('HINCRBY', key, j, delta) <= 0 then
      drop_counter_window(key, j)
    end
    return 1
  end

  local function settle_period(key, a)
    local stored = redis.call('GET', key)
    if not stored then
      return 0
    end
    local e, c = string.match(stored, '^(%d+):(%d+)')
    if tonumber(e) <= now then
      return 0
    end
    local found, list = ids_take(ids_of(stored), call_id, settled_id)
    if not found then
      return lost(ids_of(stored))
    end
    local units = tonumber(c) + a - estimate
    if units <= 0 then
      redis.call('DEL', key)
      return 1
    end
    local value = string.format('%s:%d', e, units)
    if list then
      value = value .. ':' .. list
    end
    redis.call('SET', key, value, 'KEEPTTL')
    return 1
  end

  local out = { now, 0 }
  for i = 1, n do
    local code, key = ARGV[3 * i + 2], KEYS[i]
    local bound, param = tonumber(ARGV[3 * i + 3]), ARGV[3 * i + 4]
    local a = math.min(actual, bound)
    local done
    if code == 'w' or code == 'W' then
      done = settle_log(key, a, tonumber(param))
    elseif code == 'b' or code == 'B' then
      done = settle_bucket(key, a, bound, tonumber(param))
    elseif code == 'k' or code == 'K' then
      done = settle_counters(key, a, param)
    elseif code == 'f' or code == 'F' or code == 'q' or code == 'Q' then
      done = settle_period(key, a)
    elseif code == 'l' or code == 'L' then
      -- Slots are released, not settled.
      done = 0
    else
      return redis.error_reply('ERR throttlegate: unknown algorithm code ' .. tostring(code))
    end
    out[i + 2] = done
  end
  return out
end
