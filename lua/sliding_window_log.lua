-- Third in the script. Sliding-window log: `limit` units per `window`
-- microseconds. Reads `uses_log` (args.lua) and defines, made only when a
-- rule of this call is a log (nil otherwise): swl_entry(t, c),
-- swl_header(extra, ids) and swl_head(key), for replay.lua and settle.lua;
-- swl_decide(key, now, cost, limit, window, monotonic),
-- swl_commit(key, now, cost, reset_after, window, id, hdr, extra, ids,
-- newest) and swl_flush(key, hdr, extra, ids), for check.lua. Mode "s" (single_rule.lua) is the
-- same arithmetic at cost 1, written out for its common case.
--
-- The log is a Redis list with one entry per admitted check, whatever its
-- cost, sorted by time (oldest first):
--
--   "<time>"          a check of one unit (Redis stores it as an integer)
--   "<time>:<units>"  a check of more units (or settled to another cost)
--
-- A log that has ever held an entry of more than one unit, or a check made
-- in mode "C", starts with a header, "-<extra>:<ids>": extra is the sum of
-- (units - 1) over its entries, ids "<time>@<call id>,..." for the last 64
-- checks made in mode "C" that still count (oldest first; empty when none).
-- The leading "-" tells the header from an entry and never equals one. The
-- units the log holds are its entries plus the header's extra, so a log of
-- one-unit checks (the common case) has no header to rewrite, and counting
-- it is LLEN.
--
-- An entry with time `t` counts while `now < t + window`. Deciding first
-- drops the entries that have left the window from the front (invisible to
-- every reader, so a denial or a peek still changes nothing that can be
-- observed); a denial waits for the oldest entries that hold the units
-- needed. A key of an older version (a sorted set with one member per unit)
-- is converted in place on first read (swl_upgrade), counting exactly what
-- it counted.
--
-- Every time value is an integer number of microseconds (exact in a double
-- below 2^53), and every value returned is an integer. Times handed to
-- redis.call as numbers travel exactly (Redis prints them with 17
-- significant digits); times written into strings use string.format('%d').

local swl_entry, swl_header, swl_head, swl_decide, swl_commit, swl_flush
if uses_log and (mode == 'C' or mode == 'u' or mode == 'x') then
  -- The stored form of an entry of `c` units at time `t` (as written by
  -- swl_commit), and of a header.
  swl_entry = function(t, c)
    if c == 1 then
      return string.format('%d', t)
    end
    return string.format('%d:%d', t, c)
  end

  swl_header = function(extra, ids)
    return string.format('-%d:', extra) .. ids
  end
end
if uses_log then
  -- The front of the log: the header's extra and ids (0 and '' without a
  -- header), whether there is a header, and, with `oldest`, the oldest entry
  -- as stored (nil when the log is empty). Converts a key of an older
  -- version first; any other kind of key is the error Redis gives for it.
  swl_head = function(key, oldest)
    local first = redis.pcall('LINDEX', key, 0)
    if type(first) == 'table' then
      if redis.call('TYPE', key).ok ~= 'zset' then
        error(first)
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
            values[#values + 1] = c == 1 and last or string.format('%d:%d', last, c)
            last, c = s, 0
          end
          c = c + 1
        end
        values[#values + 1] = c == 1 and last or string.format('%d:%d', last, c)
        local extra = #flat / 2 - #values
        if extra > 0 then
          redis.call('RPUSH', key, string.format('-%d:', extra))
        end
        for i = 1, #values, 1000 do
          redis.call('RPUSH', key, unpack(values, i, math.min(i + 999, #values)))
        end
        if ttl > 0 then
          redis.call('PEXPIRE', key, ttl)
        end
      end
      swl_upgrade(key)
      first = redis.call('LINDEX', key, 0)
    end
    if not first then
      return 0, '', false, nil
    end
    if string.byte(first, 1) == 45 then
      local extra, ids = string.match(first, '^%-(%d+):(.*)$')
      local e
      if oldest then
        e = redis.call('LINDEX', key, 1) or nil
      end
      return tonumber(extra), ids, true, e
    end
    return 0, '', false, first
  end

  -- Decide one rule. Returns allowed (0/1), remaining, retry_after,
  -- reset_after, and for swl_commit / swl_flush: the header's state (0 none,
  -- 1 one, 2 one whose place holds a dropped entry until it is rewritten),
  -- its extra and ids, and the newest entry's time when it was read (nil
  -- otherwise).
  -- With `monotonic` (the server's own clock), no entry can be newer than
  -- `now`, so an admission's reset_after is the window.
  swl_decide = function(key, now, cost, limit, window, monotonic)
    -- The usual log has no header: its first element is the oldest entry.
    local extra, ids, header, oldest = 0, '', false, redis.pcall('LINDEX', key, '0')
    -- The usual front, a one-unit entry, reads as a number (see single_rule.lua).
    local first_t, first_c = tonumber(oldest), 1
    if first_t then
      -- (Read already.)
    elseif type(oldest) == 'table' or (oldest and string.byte(oldest, 1) == 45) then
      extra, ids, header, oldest = swl_head(key, true)
    elseif not oldest then
      oldest = nil
    end
    local h = header and 1 or 0
    local stale = false
    local total = 0
    if oldest then
      -- Drop the entries that have left the window, from the front.
      local floor = now - window
      if not first_t then
        first_t = tonumber(oldest)
      end
      if not first_t then
        local t, c = string.match(oldest, '^(%d+):(%d+)$')
        first_t, first_c = tonumber(t), tonumber(c)
      end
      if first_t <= floor then
        first_t = nil
        local k, start, size = 0, h, 8
        while true do
          local got = redis.call('LRANGE', key, start, start + size - 1)
          for j = 1, #got do
            local t, c = string.match(got[j], '^(%d+):?(%d*)$')
            t, c = tonumber(t), tonumber(c) or 1
            if t > floor then
              first_t, first_c = t, c
              break
            end
            k = k + 1
            extra = extra - (c - 1)
          end
          if first_t or #got < size then
            break
          end
          start = start + size
          size = math.min(size * 4, 1024)
        end
        if first_t == nil then
          -- Nothing is left: no state, as an empty log has none.
          redis.call('DEL', key)
          extra, ids, header, h = 0, '', false, 0
        else
          -- Without a header, entries k.. stay; with one, entry k (gone)
          -- takes the header's place until it is rewritten.
          redis.call('LTRIM', key, k, -1)
          stale = header
        end
      end
      if first_t then
        total = redis.call('LLEN', key) - h + extra
      end
    end
    local hdr = h
    if stale then
      hdr = 2
    end
    local newest
    if total + cost <= limit then
      -- Admitted: the newest entry will be `now`, or a later one written by a
      -- client whose clock is ahead (client time); a peek at cost 0 adds nothing.
      local reset_after = 0
      if cost > 0 then
        reset_after = window
      end
      if total > 0 and not (monotonic and cost > 0) then
        newest = tonumber(string.match(redis.call('LINDEX', key, '-1'), '^(%d+)'))
        local r = newest + window - now
        if r > reset_after then
          reset_after = r
        end
      end
      return 1, limit - total - cost, 0, reset_after, hdr, extra, ids, newest
    end
    if total == 0 then
      -- Nothing stored can make room (a cost above the limit, refused before the script).
      return 0, limit, 0, 0, hdr, extra, ids
    end
    -- Denied: wait until the oldest entries holding `need` units have left.
    local need = total + cost - limit
    local t = first_t
    if need > first_c then
      local at = h
      while need > 0 do
        local chunk = redis.call('LRANGE', key, at, at + 255)
        for j = 1, #chunk do
          local et, ec = string.match(chunk[j], '^(%d+):?(%d*)$')
          need = need - (tonumber(ec) or 1)
          -- The latest time so far: an entry out of order (a reserved one,
          -- reserve.lua) holds those behind it until it leaves.
          if tonumber(et) > t then
            t = tonumber(et)
          end
          if need <= 0 then
            break
          end
        end
        if #chunk == 0 then
          break
        end
        at = at + #chunk
      end
    end
    newest = tonumber(string.match(redis.call('LINDEX', key, -1), '^(%d+)'))
    return 0, limit - total, t + window - now, newest + window - now, hdr, extra, ids
  end

  -- Record a check of `cost` units at `now` (hdr, extra, ids, newest from
  -- swl_decide); `id`,
  -- the call id of a check made in mode "C" (nil otherwise), joins the ids,
  -- which lose those that no longer count and keep the newest 64. The key
  -- expires when the log would be empty.
  swl_commit = function(key, now, cost, reset_after, window, id, hdr, extra, ids, newest)
    if id then
      -- (The window may come as its argument string: read only here.)
      window = tonumber(window)
      ids = ids_push(ids, string.format('%d@', now) .. id, function(e)
        return tonumber(string.match(e, '^(%d+)')) + window > now
      end)
    end
    local entry
    if cost == 1 then
      entry = string.format('%d', now)
    else
      entry = string.format('%d:%d', now, cost)
    end
    if not (newest and now < newest) then
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
    if cost ~= 1 or id or hdr == 2 then
      local value = string.format('-%d:', extra + cost - 1) .. ids
      if hdr > 0 then
        redis.call('LSET', key, 0, value)
      else
        redis.call('LPUSH', key, value)
      end
    end
    if reserve_spec then
      -- A reserved entry (reserve.lua) may count longer than this one: never shorten it.
      local ms = string.format('%d', math.ceil(reset_after / 1000))
      if redis.call('PEXPIRE', key, ms, 'GT') == 0 and redis.call('PTTL', key) < 0 then
        redis.call('PEXPIRE', key, ms)
      end
    else
      redis.call('PEXPIRE', key, math.ceil(reset_after / 1000))
    end
  end

  -- A check that records nothing: rewrite the header when deciding dropped
  -- entries (hdr, extra, ids from swl_decide).
  swl_flush = function(key, hdr, extra, ids)
    if hdr == 2 then
      redis.call('LSET', key, 0, string.format('-%d:', extra) .. ids)
    end
  end
end
