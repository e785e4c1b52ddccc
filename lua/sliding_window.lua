-- Fifth in the script. Sliding window of counters: at most `limit` units in
-- any window of `window` microseconds, counted per sub-window of `precision`
-- microseconds. Reads `uses_counters` and `floor_div` (args.lua) and defines
-- three locals, made only when a rule of this call is one (nil otherwise):
-- sw_spec(spec), for the others and replay.lua, and, for check.lua,
-- sw_decide(key, now, cost, limit, spec) and
-- sw_commit(key, now, cost, reset_after, spec, call_id, ids, oldest, newest).
-- It also reads `mode` (args.lua): the recent ids are read only in mode "C".
--
-- Sub-window j spans [j * precision, (j + 1) * precision). A unit admitted in
-- sub-window j counts while now < (j + 1) * precision + window: until the end
-- of its sub-window plus the window. Each unit therefore counts at least as
-- long as an exact log counts it (never more admitted in any window than the
-- log would allow) and at most one sub-window longer (never later than the
-- log by more than one sub-window). The counted sub-windows are those with
-- j >= floor((now - window) / precision): at most ceil(window / precision) + 1
-- of them, whatever the limit.
--
-- The state is a hash: field "<j>" (decimal) -> units admitted in sub-window
-- j, and beside them field "t" (the units of every "<j>" field), "o" and "n"
-- (the oldest and newest j stored) and, once a call asked for deduplication
-- (mode "C"), fields "i1", "i2", ... -> "<j>:<tag>,..." for the last 64 such
-- admissions (newest last; sw_ids_get / sw_ids_put below, also for
-- replay.lua and settle.lua). A decision reads "t", "o", "n" (and the ids in
-- mode "C") with one HMGET: while the oldest sub-window still counts, the
-- count is "t". Once it has stopped counting, deciding drops the fields of
-- every sub-window that no longer counts (invisible to every reader) and
-- rewrites "t" and "o"; a denial reads the oldest sub-window, and all of
-- them only when that one alone does not free enough. sw_commit is the only
-- other writer and runs only after every rule of the check has passed: it
-- adds to "<j>" and "t" and, when the sub-window is a new oldest or newest,
-- sets "o" / "n" (and the key's TTL: it expires when its newest sub-window
-- stops counting).

local sw_spec, sw_decide, sw_commit, sw_ids_get, sw_ids_put
if uses_counters then
  -- The recent ids (mode "C": "<j>:<tag>,...", oldest first) are kept in
  -- fields "i1", "i2", ... of at most 64 bytes each, whole entries in
  -- order: a longer field (hash-max-listpack-value) would make Redis keep
  -- the whole hash, every sub-window field, in its larger encoding. 64
  -- entries of at most 25 bytes need at most 32 fields.
  local id_fields = {}
  for k = 1, 32 do
    id_fields[k] = 'i' .. k
  end

  -- The recent ids stored under `key`, as one text (false when none).
  sw_ids_get = function(key)
    local parts = {}
    for _, v in ipairs(redis.call('HMGET', key, unpack(id_fields))) do
      if v then
        parts[#parts + 1] = v
      end
    end
    if #parts == 0 then
      return false
    end
    return table.concat(parts, ',')
  end

  -- Store the recent ids `list` (text, nil when none) under `key`.
  sw_ids_put = function(key, list)
    local set, cur = {}, nil
    for e in string.gmatch(list or '', '[^,]+') do
      if cur == nil then
        cur = e
      elseif #cur + 1 + #e <= 64 then
        cur = cur .. ',' .. e
      else
        set[#set + 1] = 'i' .. (#set / 2 + 1)
        set[#set + 1] = cur
        cur = e
      end
    end
    if cur then
      set[#set + 1] = 'i' .. (#set / 2 + 1)
      set[#set + 1] = cur
    end
    if #set > 0 then
      redis.call('HSET', key, unpack(set))
    end
    -- The fields no longer used, and the single "ids" field of an earlier version.
    local gone = { 'ids' }
    for k = #set / 2 + 1, 32 do
      gone[#gone + 1] = id_fields[k]
    end
    redis.call('HDEL', key, unpack(gone))
  end

  -- The rule's third argument "<window_us>:<precision_us>" as two numbers.
  sw_spec = function(spec)
    local w, p = string.match(spec, '^(%d+):(%d+)$')
    return tonumber(w), tonumber(p)
  end

  -- Decide one rule. Returns allowed (0/1), remaining, retry_after,
  -- reset_after, and for sw_commit the "ids" field as read (false when absent
  -- or not read), and the oldest and newest sub-windows stored (nil when none).
  sw_decide = function(key, now, cost, limit, spec)
    local window, precision = sw_spec(spec)
    local first = floor_div(now - window, precision)
    local head = redis.call('HMGET', key, 't', 'o', 'n')
    local count = tonumber(head[1]) or 0
    local oldest = tonumber(head[2])
    local newest = tonumber(head[3])
    local ids = false
    if mode == 'C' and oldest then
      ids = sw_ids_get(key)
    end
    if oldest and oldest < first then
      -- Some sub-windows have stopped counting: drop them.
      local flat = redis.call('HGETALL', key)
      local stale = {}
      count, oldest = 0, nil
      for i = 1, #flat, 2 do
        local j = tonumber(flat[i])
        if j then
          if j < first then
            stale[#stale + 1] = flat[i]
          else
            count = count + tonumber(flat[i + 1])
            if oldest == nil or j < oldest then
              oldest = j
            end
          end
        end
      end
      if oldest == nil then
        -- Nothing counts any more, nor do the ids of those sub-windows.
        redis.call('DEL', key)
        newest, ids = nil, false
      else
        redis.call('HDEL', key, unpack(stale))
        redis.call('HSET', key, 't', count, 'o', string.format('%d', oldest))
      end
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
      return 1, limit - count - cost, 0, reset_after, ids, oldest, newest
    end
    -- Denied: wait until the oldest sub-windows holding `need` units have
    -- stopped counting. Usually the oldest alone holds enough.
    local need = count + cost - limit
    local reset_after = (newest + 1) * precision + window - now
    local o = string.format('%d', oldest)
    if (tonumber(redis.call('HGET', key, o)) or 0) >= need then
      return 0, limit - count, (oldest + 1) * precision + window - now, reset_after, ids, oldest, newest
    end
    local flat = redis.call('HGETALL', key)
    local subs, units = {}, {}
    for i = 1, #flat, 2 do
      local j = tonumber(flat[i])
      if j then
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
    return 0, limit - count, retry_after, reset_after, ids, oldest, newest
  end

  -- Record `cost` units in the current sub-window. `call_id` (nil unless the
  -- call asked for deduplication) joins the recent ids, which lose the
  -- entries whose sub-window no longer counts and keep the newest 64; `ids`,
  -- `oldest` and `newest` are as sw_decide read them.
  sw_commit = function(key, now, cost, reset_after, spec, call_id, ids, oldest, newest)
    local window, precision = sw_spec(spec)
    local j = floor_div(now, precision)
    local current = string.format('%d', j)
    redis.call('HINCRBY', key, current, cost)
    redis.call('HINCRBY', key, 't', cost)
    local expiry = false
    if newest == nil then
      redis.call('HSET', key, 'o', current, 'n', current)
      expiry = true
    elseif j > newest then
      redis.call('HSET', key, 'n', current)
      expiry = true
    elseif j < oldest then
      redis.call('HSET', key, 'o', current)
    end
    if call_id then
      local first = floor_div(now - window, precision)
      sw_ids_put(key, ids_push(ids, current .. ':' .. call_id, function(e)
        local s = string.match(e, '^(%d+):')
        return s and tonumber(s) >= first
      end))
    end
    -- The key expires when its newest sub-window stops counting: set only
    -- when the newest changes (`reset_after` counts to that same moment).
    if expiry then
      redis.call('PEXPIRE', key, math.ceil(reset_after / 1000))
    end
  end
end
