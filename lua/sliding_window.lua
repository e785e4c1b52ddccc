-- Fifth in the script. Sliding window of counters: at most `limit` units in
-- any window of `window` microseconds, counted per sub-window of `precision`
-- microseconds. Reads `uses_counters` and `floor_div` (args.lua) and defines
-- three locals, made only when a rule of this call is one (nil otherwise):
-- sw_spec(spec), for the others and replay.lua, and, for check.lua,
-- sw_decide(key, now, cost, limit, spec) and
-- sw_commit(key, now, cost, reset_after, spec, call_id, ids).
--
-- Sub-window j spans [j * precision, (j + 1) * precision). A unit admitted in
-- sub-window j counts while now < (j + 1) * precision + window: until the end
-- of its sub-window plus the window. Each unit therefore counts at least as
-- long as an exact log counts it (never more admitted in any window than the
-- log would allow) and at most one sub-window longer (never later than the
-- log by more than one sub-window). The counted sub-windows are those with
-- j >= floor((now - window) / precision): at most window / precision + 2 of
-- them, whatever the limit.
--
-- The state is a hash: field "<j>" (decimal) -> units admitted in sub-window
-- j, and, once a call asked for deduplication (mode "C"), field "ids" ->
-- "<j>:<call id>,..." for the last 64 such admissions (newest last). Deciding
-- first drops the fields of sub-windows that no longer count (invisible to
-- every reader); sw_commit is the only other writer and runs only after every
-- rule of the check has passed. The key expires when its newest sub-window
-- stops counting.

local sw_spec, sw_decide, sw_commit
if uses_counters then
  -- The rule's third argument "<window_us>:<precision_us>" as two numbers.
  sw_spec = function(spec)
    local w, p = string.match(spec, '^(%d+):(%d+)$')
    return tonumber(w), tonumber(p)
  end

  -- Decide one rule. Returns allowed (0/1), remaining, retry_after,
  -- reset_after, and the "ids" field as read (false when absent), for sw_commit.
  sw_decide = function(key, now, cost, limit, spec)
    local window, precision = sw_spec(spec)
    local first = floor_div(now - window, precision)
    local flat = redis.call('HGETALL', key)
    local count, newest, ids, stale = 0, nil, false, nil
    for i = 1, #flat, 2 do
      local j = tonumber(flat[i])
      if j == nil then
        ids = flat[i + 1]
      elseif j >= first then
        count = count + tonumber(flat[i + 1])
        if newest == nil or j > newest then
          newest = j
        end
      else
        stale = stale or {}
        stale[#stale + 1] = flat[i]
      end
    end
    if stale then
      redis.call('HDEL', key, unpack(stale))
    end
    if count + cost <= limit then
      local top = newest
      if cost > 0 then
        local current = floor_div(now, precision)
        if top == nil or current > top then
          top = current
        end
      end
      local reset_after = 0
      if top then
        reset_after = (top + 1) * precision + window - now
      end
      return 1, limit - count - cost, 0, reset_after, ids
    end
    -- Denied: wait until the oldest sub-windows holding `need` units have
    -- stopped counting.
    local need = count + cost - limit
    local subs, units = {}, {}
    for i = 1, #flat, 2 do
      local j = tonumber(flat[i])
      if j and j >= first then
        subs[#subs + 1] = j
        units[j] = tonumber(flat[i + 1])
      end
    end
    table.sort(subs)
    local held, retry_after = 0, 0
    for _, j in ipairs(subs) do
      held = held + units[j]
      if held >= need then
        retry_after = (j + 1) * precision + window - now
        break
      end
    end
    return 0, limit - count, retry_after, (newest + 1) * precision + window - now, ids
  end

  -- Record `cost` units in the current sub-window. `call_id` (nil unless the
  -- call asked for deduplication) joins the recent ids, which lose the
  -- entries whose sub-window no longer counts and keep the newest 64; `ids`
  -- is the field as read by sw_decide.
  sw_commit = function(key, now, cost, reset_after, spec, call_id, ids)
    local window, precision = sw_spec(spec)
    local current = string.format('%d', floor_div(now, precision))
    redis.call('HINCRBY', key, current, cost)
    if call_id then
      local first = floor_div(now - window, precision)
      local kept = {}
      for j, id in string.gmatch(ids or '', '(%d+):([^,]+)') do
        if tonumber(j) >= first then
          kept[#kept + 1] = j .. ':' .. id
        end
      end
      kept[#kept + 1] = current .. ':' .. call_id
      redis.call('HSET', key, 'ids', table.concat(kept, ',', math.max(1, #kept - 64 + 1), #kept))
    end
    redis.call('PEXPIRE', key, math.ceil(reset_after / 1000))
  end
end
