-- Third in the script. Sliding-window log: `limit` units per `window`
-- microseconds. Reads `uses_log`, `now` (args.lua) and defines, made only
-- when a rule of this call is a log (nil otherwise): swl_entry(t, c),
-- swl_head(key) and swl_header(total, newest, ids), for replay.lua and
-- settle.lua; swl_decide(key, now, cost, limit, window, monotonic),
-- swl_commit(key, now, cost, reset_after, window, id, state) and
-- swl_flush(key, state), for check.lua. Mode "s" (single_rule.lua) is the
-- same arithmetic at cost 1, written out for its common case.
--
-- The log is a Redis list holding one entry per admitted check, whatever its
-- cost, oldest first, after a header:
--
--   index 0    "<units>:<newest>:<ids>"  the units of every entry stored,
--              the newest entry's time, and the ids of the last 64 checks
--              made in mode "C" that still count, as "<time>@<id>" separated
--              by "," (oldest first; empty when none). The trailing ":" is
--              always there, so the header never equals an entry.
--   index 1..  "<time>" for a check of one unit, "<time>:<units>" otherwise,
--              sorted by time (an entry written with an earlier time than the
--              newest is inserted in order).
--
-- An entry with time `t` counts while `now < t + window`. Deciding first
-- drops the entries that have left the window from the front and takes their
-- units off the header's count (invisible to every reader, so a denial or a
-- peek still changes nothing that can be observed); the count is then the
-- header's, and a denial waits for the oldest entries that hold the units
-- needed. A key of an older version (a sorted set with one member per unit)
-- is converted in place on first read (swl_upgrade), counting exactly what it
-- counted.
--
-- Every time value is an integer number of microseconds (exact in a double
-- below 2^53), and every value returned is an integer. Stored numbers are
-- written with string.format('%d').

local swl_entry, swl_header, swl_head, swl_decide, swl_commit, swl_flush
if uses_log then
  -- The stored form of an entry of `c` units at time `t`.
  swl_entry = function(t, c)
    if c == 1 then
      return string.format('%d', t)
    end
    return string.format('%d:%d', t, c)
  end

  swl_header = function(total, newest, ids)
    return string.format('%d:%d:', total, newest) .. ids
  end

  -- A key written by an older version holds a sorted set, one member per
  -- unit scored by its time: rewrite it as this list (one entry per distinct
  -- time, with its units), keeping its TTL. Ids are not carried over.
  local function swl_upgrade(key)
    local ttl = redis.call('PTTL', key)
    local flat = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
    redis.call('DEL', key)
    if #flat == 0 then
      return
    end
    local values = {}
    local last, c = tonumber(flat[2]), 0
    for i = 2, #flat, 2 do
      local s = tonumber(flat[i])
      if s ~= last then
        values[#values + 1] = swl_entry(last, c)
        last, c = s, 0
      end
      c = c + 1
    end
    values[#values + 1] = swl_entry(last, c)
    redis.call('RPUSH', key, swl_header(#flat / 2, last, ''))
    for i = 1, #values, 1000 do
      redis.call('RPUSH', key, unpack(values, i, math.min(i + 999, #values)))
    end
    if ttl > 0 then
      redis.call('PEXPIRE', key, ttl)
    end
  end

  -- The list's first `k` + 1 elements (the header, then the oldest entries),
  -- upgrading a key of an older version first; an empty table when absent.
  -- Any other kind of key is the error Redis gives for it.
  local function swl_read(key, k)
    local got = redis.pcall('LRANGE', key, 0, k)
    if got.err then
      if redis.call('TYPE', key).ok ~= 'zset' then
        error(got)
      end
      swl_upgrade(key)
      got = redis.call('LRANGE', key, 0, k)
    end
    return got
  end

  -- The header: units, newest time, ids (nil when the key is absent).
  swl_head = function(key)
    local got = swl_read(key, 0)
    if not got[1] then
      return nil
    end
    local total, newest, ids = string.match(got[1], '^(%d+):(%d+):(.*)$')
    return tonumber(total), tonumber(newest), ids
  end

  -- Decide one rule. Returns allowed (0/1), remaining, retry_after,
  -- reset_after, and the state for swl_commit / swl_flush: { units, newest,
  -- ids, stored (the key exists), header stale (entries were dropped and the
  -- header not yet rewritten) }. With `monotonic` (the server's own clock), no
  -- entry can be newer than `now`, so an admission's reset_after is the window.
  swl_decide = function(key, now, cost, limit, window, monotonic)
    local got = swl_read(key, 4)
    local total, newest, ids, stale = 0, 0, '', false
    local first_t, first_c
    if got[1] then
      local t, nw, i = string.match(got[1], '^(%d+):(%d+):(.*)$')
      total, newest, ids = tonumber(t), tonumber(nw), i
      -- Drop the entries that have left the window, from the front.
      local floor = now - window
      local k, at = 0, 2
      while total > 0 do
        local e = got[at]
        if e == nil then
          got = redis.call('LRANGE', key, k + 1, k + 256)
          at = 1
          e = got[1]
          if e == nil then
            total = 0
            break
          end
        end
        local et, ec = string.match(e, '^(%d+):?(%d*)$')
        et = tonumber(et)
        ec = tonumber(ec) or 1
        if et > floor then
          first_t, first_c = et, ec
          break
        end
        total = total - ec
        k = k + 1
        at = at + 1
      end
      if k > 0 then
        if total <= 0 then
          redis.call('DEL', key)
          total, newest, ids = 0, 0, ''
          got = {}
        else
          -- Entry k (gone) takes the header's place until it is rewritten.
          redis.call('LTRIM', key, k, -1)
          stale = true
        end
      end
    end
    local state = { total, newest, ids, total > 0, stale }
    if total + cost <= limit then
      -- Admitted: the newest entry will be `now`, or a later one written by a
      -- client whose clock is ahead (client time); a peek at cost 0 adds nothing.
      local reset_after = 0
      if cost > 0 then
        reset_after = window
      end
      if total > 0 and not (monotonic and cost > 0) then
        local r = newest + window - now
        if r > reset_after then
          reset_after = r
        end
      end
      return 1, limit - total - cost, 0, reset_after, state
    end
    -- Denied: wait until the oldest entries holding `need` units have left.
    local need = total + cost - limit
    local t = first_t
    if first_c == nil or need > first_c then
      local at = 1
      while need > 0 do
        local chunk = redis.call('LRANGE', key, at, at + 255)
        for j = 1, #chunk do
          local et, ec = string.match(chunk[j], '^(%d+):?(%d*)$')
          need = need - (tonumber(ec) or 1)
          if need <= 0 then
            t = tonumber(et)
            break
          end
        end
        if #chunk == 0 then
          break
        end
        at = at + #chunk
      end
    end
    if t == nil then
      -- Nothing stored can make room (a cost above the limit, refused before the script).
      return 0, limit - total, 0, 0, state
    end
    return 0, limit - total, t + window - now, newest + window - now, state
  end

  -- Record a check of `cost` units at `now` (state from swl_decide); `id`,
  -- the call id of a check made in mode "C" (nil otherwise), joins the ids,
  -- which lose those that no longer count and keep the newest 64. The key
  -- expires when the log would be empty.
  swl_commit = function(key, now, cost, reset_after, window, id, state)
    local total, newest, ids, stored = state[1], state[2], state[3], state[4]
    if id then
      local kept = {}
      for e in string.gmatch(ids, '[^,]+') do
        if tonumber(string.match(e, '^(%d+)')) + window > now then
          kept[#kept + 1] = e
        end
      end
      kept[#kept + 1] = string.format('%d@', now) .. id
      ids = table.concat(kept, ',', math.max(1, #kept - 64 + 1), #kept)
    end
    local entry = swl_entry(now, cost)
    if not stored then
      redis.call('RPUSH', key, swl_header(cost, now, ids), entry)
    else
      if now >= newest then
        redis.call('RPUSH', key, entry)
      else
        -- A time before the newest entry's (a clock behind another's): the
        -- entry goes before the first one that is newer, found from the end.
        local at, pivot, done = -1, nil, false
        while not done do
          local chunk = redis.call('LRANGE', key, at - 255, at)
          for j = #chunk, 1, -1 do
            local et = string.match(chunk[j], '^(%d+):?%d*$')
            if et == nil or tonumber(et) <= now then
              -- Not newer (or the header): the entry goes after it.
              done = true
              break
            end
            pivot = chunk[j]
          end
          if #chunk < 256 then
            done = true
          end
          at = at - 256
        end
        redis.call('LINSERT', key, 'BEFORE', pivot, entry)
      end
      redis.call('LSET', key, 0, swl_header(total + cost, math.max(now, newest), ids))
    end
    redis.call('PEXPIRE', key, math.ceil(reset_after / 1000))
  end

  -- A check that records nothing: rewrite the header when deciding dropped
  -- entries (state from swl_decide).
  swl_flush = function(key, state)
    if state[5] then
      redis.call('LSET', key, 0, swl_header(state[1], state[2], state[3]))
    end
  end
end
