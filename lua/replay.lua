-- Seventh in the script. Re-sent calls and give-backs, for every algorithm.
-- Reads `mode`, `uses_*`, `now` and `floor_div` (args.lua) and `sw_spec`
-- (sliding_window.lua). Assigns ids_push and ids_take (below), defines
-- drop_counter_window(key, j) for every call with counters (replays,
-- settle.lua, reserve.lua's give-backs), and these locals, made only for the
-- modes that need them ("C" and "u", and "x" for settle.lua; nil otherwise):
-- ids_of(stored) and counter_id(key, call_id, spec), for the others and
-- settle.lua, and, for check.lua,
-- seen(code, key, call_id, spec) in mode "C" and give_back(code, key, cost,
-- capacity, call_id, spec) in mode "u". `code` is a rule's algorithm code
-- ("w"/"W" sliding-window log, "b"/"B" token bucket, "k"/"K" sliding window
-- of counters, "f"/"F" fixed window, "q"/"Q" quota), `spec` its third
-- argument.

-- The recent call ids every algorithm keeps, in one shape: comma-separated
-- entries, oldest first, at most 64 (a bucket's and a period counter's
-- entry is the id, a counter's "<j>:<id>", a log's "<t>@<id>"). Assigns
-- the two names args.lua declared, when a rule of this call keeps ids
-- or the mode looks them up:
--   ids_push(list, entry, keep): `list` (text; nil, false or '' when
--     none) without the entries for which `keep` (when given) is false,
--     `entry` appended (when not nil); the newest 64 as text, nil when none.
--   ids_take(list, entry, instead): whether `list` holds `entry`, and
--     `list` without its first `entry` (nil when nothing is left), or with
--     `instead` in its place when given (a settle marks its entry so).
if uses_bucket or uses_counters or uses_period or mode == 'C' or mode == 'u' or mode == 'x' then
  ids_push = function(list, entry, keep)
    local ids = {}
    for e in string.gmatch(list or '', '[^,]+') do
      if keep == nil or keep(e) then
        ids[#ids + 1] = e
      end
    end
    if entry then
      ids[#ids + 1] = entry
    end
    if #ids == 0 then
      return nil
    end
    return table.concat(ids, ',', math.max(1, #ids - 64 + 1), #ids)
  end

  ids_take = function(list, entry, instead)
    local kept, found = {}, false
    for e in string.gmatch(list or '', '[^,]+') do
      if e == entry and not found then
        found = true
        kept[#kept + 1] = instead
      else
        kept[#kept + 1] = e
      end
    end
    if #kept == 0 then
      return found, nil
    end
    return found, table.concat(kept, ',')
  end
end

local ids_of, counter_id, drop_counter_window, seen, give_back
local log_check_time, log_rewrite
-- For a sliding window of counters: remove the emptied sub-window `j`
-- and find the oldest and newest ones again (the key goes when none is left).
-- Made for every call with counters: replays, settles and give-backs (reserve.lua) use it.
if uses_counters then
  drop_counter_window = function(key, j)
    redis.call('HDEL', key, j)
    local oldest, newest
    local flat = redis.call('HGETALL', key)
    for i = 1, #flat, 2 do
      local s = tonumber(flat[i])
      if s then
        if oldest == nil or s < oldest then
          oldest = s
        end
        if newest == nil or s > newest then
          newest = s
        end
      end
    end
    if oldest == nil then
      redis.call('DEL', key)
    else
      redis.call('HSET', key, 'o', string.format('%d', oldest), 'n', string.format('%d', newest))
    end
  end
end

if mode == 'u' or mode == 'C' or mode == 'x' then
  -- What the lists store of a call id is a tag of 8 characters: the
  -- first 48 bits of its SHA-1 in the alphabet of call ids (A-Z a-z 0-9 -
  -- _). A call id is up to 64 characters; 64 of them made a key of 5 KB,
  -- where telling the last 64 calls of a key from any other needs only a
  -- tag (two calls' tags are equal once in 2^48). From here on `call_id`
  -- is the call's tag, in every mode that records or looks ids up.
  local digits = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'
  local hex = redis.sha1hex(call_id)
  local tag = {}
  for k = 0, 3 do
    local v = tonumber(string.sub(hex, 3 * k + 1, 3 * k + 3), 16)
    local hi, lo = math.floor(v / 64), v % 64
    tag[2 * k + 1] = string.sub(digits, hi + 1, hi + 1)
    tag[2 * k + 2] = string.sub(digits, lo + 1, lo + 1)
  end
  call_id = table.concat(tag)

  -- For a log: the time of the check `call_id` among the ids its header
  -- keeps, while it still counts (any time when `window` is nil), then the
  -- header's extra and ids; nil when not found.
  log_check_time = function(key, call_id, window)
    local extra, ids = swl_head(key, false)
    for t, id in string.gmatch(ids, '(%d+)@([^,]+)') do
      if id == call_id then
        t = tonumber(t)
        if window == nil or t + window > now then
          return t, extra, ids
        end
      end
    end
    return nil
  end

  -- A log's header after its entries changed: `extra`, and `ids` without
  -- the check `call_id` made at `t` (or with it marked settled, "!" after
  -- it, when `settled`); the key is deleted when no unit is left.
  log_rewrite = function(key, extra, ids, t, call_id, settled)
    if redis.call('LLEN', key) - 1 + extra <= 0 then
      redis.call('DEL', key)
      return
    end
    local entry = string.format('%d@', t) .. call_id
    local _, rest = ids_take(ids, entry, settled and entry .. '!' or nil)
    redis.call('LSET', key, 0, swl_header(extra, rest or ''))
  end

  -- The call ids recorded in a stored bucket or period counter ("" when none).
  ids_of = function(stored)
    return string.match(stored, '^-?%d+:%d+:(.*)$') or ''
  end

  -- For a sliding window of counters: the "ids" field, and the sub-window
  -- (as written) that `call_id` was admitted in while it still counts (nil
  -- when the call is not among the recent ids or its sub-window has left).
  counter_id = function(key, call_id, spec)
    local ids = sw_ids_get(key)
    if not ids then
      return false, nil
    end
    local window, precision = sw_spec(spec)
    local first = floor_div(now - window, precision)
    for j, id in string.gmatch(ids, '(%d+):([^,]+)') do
      if id == call_id and tonumber(j) >= first then
        return ids, j
      end
    end
    return ids, nil
  end

  -- True when the call `call_id` was already recorded under `key` (a re-sent
  -- call that Redis had executed): a member of a log, or one of the last 64
  -- admissions recorded in a bucket.
  seen = function(code, key, call_id, spec)
    if code == 'l' or code == 'L' then
      return cc_seen(key, ARGV[3]) -- the lease id as sent, not its tag
    end
    if code == 'w' or code == 'W' then
      return log_check_time(key, call_id, tonumber(spec)) ~= nil
    end
    if code == 'k' or code == 'K' then
      local _, j = counter_id(key, call_id, spec)
      return j ~= nil
    end
    local stored = redis.call('GET', key)
    if not stored then
      return false
    end
    if code ~= 'b' and code ~= 'B' and tonumber(string.match(stored, '^(%d+)')) <= now then
      -- A period counter whose period has ended: its ids are gone with it.
      return false
    end
    return (ids_take(ids_of(stored), call_id))
  end

  -- Give back what the check `call_id` recorded under `key` (Redis Cluster:
  -- another slot of the same check denied it). `capacity` is a bucket's. A
  -- bucket's, a counter's or a period counter's id leaves its list as the
  -- units come back, so a re-sent give-back cannot refund twice; a call whose
  -- id has already dropped out of the list (or whose sub-window or period has
  -- ended) is not refunded (a brief over-restriction, never an over-admission).
  give_back = function(code, key, cost, capacity, call_id, spec)
    if code == 'l' or code == 'L' then
      cc_drop(key, ARGV[3]) -- the lease id as sent, not its tag
      return
    end
    if code == 'w' or code == 'W' then
      local t, extra, ids = log_check_time(key, call_id, nil)
      if t == nil then
        return
      end
      if redis.call('LREM', key, 1, swl_entry(t, cost)) == 1 then
        extra = extra - (cost - 1)
      end
      log_rewrite(key, extra, ids, t, call_id)
      return
    end
    if code == 'k' or code == 'K' then
      local ids, j = counter_id(key, call_id, spec)
      if j == nil then
        return
      end
      local _, kept = ids_take(ids, j .. ':' .. call_id)
      if redis.call('HINCRBY', key, 't', -cost) <= 0 then
        -- Nothing is left: no state, as a check that never happened leaves none.
        redis.call('DEL', key)
        return
      end
      sw_ids_put(key, kept)
      if redis.call('HINCRBY', key, j, -cost) <= 0 then
        drop_counter_window(key, j)
      end
      return
    end
    local stored = redis.call('GET', key)
    if not stored then
      return
    end
    local t, ts = string.match(stored, '^(-?%d+):(%d+)')
    if code ~= 'b' and code ~= 'B' and tonumber(t) <= now then
      -- A period counter whose period has ended: nothing of it counts any more.
      return
    end
    local found, kept = ids_take(ids_of(stored), call_id)
    if not found then
      return
    end
    local value
    if code == 'b' or code == 'B' then
      local full = capacity * 1000000
      local tokens = math.min(full, tonumber(t) + cost * 1000000)
      if tokens >= full and not kept then
        -- Full again and no id left: the same as no state, which a check
        -- that never happened leaves.
        redis.call('DEL', key)
        return
      end
      value = string.format('%d:%s', tokens, ts)
    else
      -- A period counter is "<end>:<units>": the units go back, and a counter
      -- back at zero is deleted, as a check that never happened leaves none.
      local units = tonumber(ts) - cost
      if units <= 0 then
        redis.call('DEL', key)
        return
      end
      value = string.format('%s:%d', t, units)
    end
    if kept then
      value = value .. ':' .. kept
    end
    redis.call('SET', key, value, 'KEEPTTL')
  end
end
