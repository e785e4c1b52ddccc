-- Ninth in the script, before the driver: reservations (a rule's `reserve`,
-- docs/concepts/reserve.md). Reads `mode`, `now`, `n` and `reserve_spec`
-- (args.lua: nil unless the call sent the reservation argument), the
-- algorithm files' helpers (sw_spec, floor_div, tb_wait) and makes nothing
-- when the argument is absent. Fixed windows and quotas (codes "f", "q"),
-- sliding windows of counters ("k"), logs ("w") and token buckets ("b") are
-- reserved; the core sends no reservation for any other rule, nor for a
-- shadow rule.
--
-- Mode "r": a check (exactly as "c") that also reserves. `reserve_spec` is
-- one item per rule, comma-separated:
--
--   "<ask>/<for_us>"                 take up to `ask` units beyond the cost,
--                                    spendable for at most `for_us` (0: not reserved)
--   "<ask>/<for_us>:<give-back>"     the same, after giving the leftover of
--                                    this limiter's reservation back (below)
--
-- When the request goes through, each such rule takes min(ask,
-- floor(remaining / 2)) more units (its remaining after the cost): never
-- more than the limit, and never more than half of what is left, so a
-- reservation shrinks as the rule fills and the last units are decided one
-- request at a time. The rule's remaining drops by them: it is the
-- backend's count, outstanding reservations included. The reply gets, after
-- everything else, four values per rule: the units granted, how long they
-- may be spent (µs from `now`), the reservation's tag (for its give-back)
-- and, for a bucket, the micro-tokens left after the grant (else 0).
--
--   f, q  the units are counted in the period decided in, like the cost;
--         spendable until the period ends; tag: the period's end.
--   k     counted in the current sub-window j, like the cost; spendable
--         until that sub-window ends, and before the next sub-window leaves
--         the count (the count then changes only by admissions); tag: j.
--   w     pushed as ONE entry "<d>:<units>" stamped at the spend deadline
--         d = now + for_us, so the units count until d + window, after any
--         use in [now, d]; tag: d. Entries of other processes pushed before
--         d may follow it in the list: pruning drops only from the front,
--         so such an entry counts longer, never shorter. The key's TTL only
--         grows while a reservation is in it (PEXPIRE GT).
--   b     taken off the tokens and listed in the bucket's value after ";"
--         as "<id>/<units>/<e>", e = now + the spend time; tag: the id. The
--         spend time is at most for_us and ends before the tokens plus the
--         units of every listed reservation could refill to the capacity,
--         so refilling is never clipped while a reservation is spendable
--         (and the bucket's arithmetic stays tb_decide's).
--
-- Give-back ("<units>:<tag>[:<spends>]", mode "g" or after "<ask>/<for_us>:"):
--
--   f, q  the count drops by at most `units`, only while the stored period
--         is the one reserved from (its end is the tag) and still runs.
--   k     sub-window `tag` drops by at most `units` while it still counts.
--   w     the entry "<tag>:<units + spent>" (found from the end) is replaced
--         by the entries of what was spent, `<spends>` = "<t>/<c>;..." (times
--         at most the tag): the first in its place, the others pushed at the
--         end. One limiter's log ends up as the direct path's (its entry was
--         the newest); with other entries after it, the later ones count
--         longer, never shorter.
--   b     while the reservation is spendable, or after it when the bucket
--         has not changed since it ended (its stamp is not later), the
--         tokens get the units back (refilled to now, at most the capacity);
--         the reservation leaves the list. A limiter gives its spent
--         reservation back with 0 units in the trip that takes the next one,
--         so the list holds about one reservation per limiter, not every
--         reservation taken in the last `reserve_for`.
--
-- A count or log left with no unit deletes the key. Mode "g" returns
-- { now, 0, then per rule the units given back }.

local reserve_grant, reserve_commit, reserve_tail
if reserve_spec then
  local items = {}
  for a in string.gmatch(reserve_spec, '[^,]+') do
    items[#items + 1] = a
  end
  local function code_of(i)
    return ARGV[3 * i + 2]
  end

  -- A bucket's value: micro-tokens, stamp, the text after them up to ";"
  -- (the ids, "" when none) and the reservations as a list of
  -- { id, units, end }.
  local function b_read(key)
    local stored = redis.call('GET', key)
    if not stored then
      return nil
    end
    local t, ts, ids, res = string.match(stored, '^(-?%d+):(%d+)([^;]*);?(.*)$')
    local list = {}
    for id, u, e in string.gmatch(res, '(%d+)/(%d+)/(%d+)') do
      list[#list + 1] = { tonumber(id), tonumber(u), tonumber(e) }
    end
    return tonumber(t), tonumber(ts), ids, list
  end

  -- Write a bucket back, keeping only the reservations still spendable;
  -- the key lives until the bucket would be full and every one of them has ended.
  local function b_write(key, tokens, stamp, ids, list, capacity, rate)
    local parts, last = {}, now
    for _, r in ipairs(list) do
      if r[3] > now then
        parts[#parts + 1] = string.format('%d/%d/%d', r[1], r[2], r[3])
        if r[3] > last then
          last = r[3]
        end
      end
    end
    local value = string.format('%d:%d', tokens, stamp) .. ids
    if #parts > 0 then
      value = value .. ';' .. table.concat(parts, ',')
    end
    local ttl = math.max(stamp + tb_wait(capacity * 1000000 - tokens, rate), last) - now
    redis.call('SET', key, value, 'PX', math.max(1, math.ceil(ttl / 1000)))
  end

  local give = {}

  give.period = function(i, units, tag)
    local stored = redis.call('GET', KEYS[i])
    if not stored then
      return 0
    end
    local e, c, rest = string.match(stored, '^(%d+):(%d+)(.*)$')
    if tonumber(e) ~= tag or tonumber(e) <= now then
      return 0
    end
    local count = tonumber(c)
    local given = math.min(units, count)
    if count - given <= 0 then
      redis.call('DEL', KEYS[i])
    else
      redis.call('SET', KEYS[i], string.format('%s:%d%s', e, count - given, rest), 'KEEPTTL')
    end
    return given
  end

  give.k = function(i, units, j)
    local key = KEYS[i]
    local window, precision = sw_spec(ARGV[3 * i + 4])
    if j < floor_div(now - window, precision) then
      return 0
    end
    local field = string.format('%d', j)
    local have = tonumber(redis.call('HGET', key, field)) or 0
    local given = math.min(units, have)
    if given <= 0 then
      return 0
    end
    if redis.call('HINCRBY', key, 't', -given) <= 0 then
      redis.call('DEL', key)
      return given
    end
    if have == given then
      -- The sub-window is empty: its field goes, and the oldest and newest are found again.
      drop_counter_window(key, field)
    else
      redis.call('HINCRBY', key, field, -given)
    end
    return given
  end

  give.w = function(i, units, d, spends)
    local key = KEYS[i]
    local entries, spent = {}, 0
    for t, c in string.gmatch(spends or '', '(%d+)/(%d+)') do
      t, c = tonumber(t), tonumber(c)
      spent = spent + c
      entries[#entries + 1] = { t, c }
    end
    local g = units + spent
    local entry = g == 1 and string.format('%d', d) or string.format('%d:%d', d, g)
    -- Searched from the end: a reserved entry is among the newest.
    local at = redis.call('LPOS', key, entry, 'RANK', -1)
    if not at then
      return 0
    end
    -- The first check paid takes the entry's place, the others go at the end:
    -- in time order when the entry was the last (one limiter), and otherwise
    -- behind newer entries, counted longer, never shorter.
    table.sort(entries, function(a, b)
      return a[1] < b[1]
    end)
    local extra = -(g - 1)
    if #entries == 0 then
      redis.call('LREM', key, -1, entry)
    else
      local values = {}
      for x, e in ipairs(entries) do
        extra = extra + e[2] - 1
        values[x] = e[2] == 1 and string.format('%d', e[1]) or string.format('%d:%d', e[1], e[2])
      end
      redis.call('LSET', key, at, values[1])
      if #values > 1 then
        redis.call('RPUSH', key, unpack(values, 2))
      end
    end
    local head = redis.call('LINDEX', key, 0)
    if head and string.byte(head, 1) == 45 then
      local x, ids = string.match(head, '^%-(%d+):(.*)$')
      local left = tonumber(x) + extra
      if left == 0 and ids == '' and redis.call('LLEN', key) == 1 then
        redis.call('DEL', key)
      else
        redis.call('LSET', key, 0, string.format('-%d:', left) .. ids)
      end
    elseif head and extra > 0 then
      redis.call('LPUSH', key, string.format('-%d:', extra))
    end
    return units
  end

  give.b = function(i, units, id)
    local key = KEYS[i]
    local tokens, stamp, ids, list = b_read(key)
    if not tokens then
      return 0
    end
    local found
    for x, r in ipairs(list) do
      if r[1] == id then
        found = x
      end
    end
    if not found then
      return 0
    end
    local r = table.remove(list, found)
    local capacity, rate = tonumber(ARGV[3 * i + 3]), tonumber(ARGV[3 * i + 4])
    local given = 0
    -- Spendable still, or ended with no change to the bucket since: as if
    -- given back while spendable (refilling was never clipped meanwhile).
    -- Nothing left (a spent reservation): it only leaves the list.
    if units > 0 and (now < r[3] or stamp <= r[3]) then
      given = units
      local full = capacity * 1000000
      if now > stamp then
        tokens = tokens + math.floor((now - stamp) * rate)
        stamp = now
      end
      tokens = math.min(tokens + units * 1000000, full)
    end
    b_write(key, tokens, stamp, ids, list, capacity, rate)
    return given
  end

  -- Give back one item "<units>:<tag>[:<spends>]" of rule i; returns the units given back.
  local function give_back_item(i, text)
    local units_s, tag_s, spends = string.match(text or '', '^(%d+):(%-?%d+):?(.*)$')
    if not units_s then
      return 0
    end
    local code = code_of(i)
    local units, tag = tonumber(units_s), tonumber(tag_s)
    if code == 'f' or code == 'q' then
      return give.period(i, units, tag)
    elseif code == 'k' then
      return give.k(i, units, tag)
    elseif code == 'w' then
      return give.w(i, units, tag, spends)
    elseif code == 'b' then
      return give.b(i, units, tag)
    end
    return 0
  end

  if mode == 'g' then
    local out = { now, 0 }
    for i = 1, n do
      out[i + 2] = give_back_item(i, items[i])
    end
    return out
  end

  -- Mode "r": the asks, and the leftovers given back before anything is
  -- decided, so the check sees what the direct path would.
  local asks, fors = {}, {}
  for i = 1, n do
    local ask_s, for_s, rest = string.match(items[i] or '', '^(%d+)/?(%d*):?(.*)$')
    asks[i] = tonumber(ask_s) or 0
    fors[i] = tonumber(for_s) or 0
    if rest and rest ~= '' then
      give_back_item(i, rest)
    end
  end

  reserve_tail = {}
  for i = 1, 4 * n do
    reserve_tail[i] = 0
  end

  -- The units each rule takes beyond the cost (rule i at [i]), taken off
  -- its remaining in `out`, with its spend time and tag in reserve_tail;
  -- `held` is check.lua's (a bucket's micro-tokens left, a period's end).
  -- Called by check.lua when the request goes through.
  local buckets = {}
  reserve_grant = function(out, held)
    local granted = {}
    for i = 1, n do
      local ask = asks[i]
      local code = code_of(i)
      local g, spend = 0, 0
      if ask > 0 and out[4 * i - 1] == 1 then
        g = math.min(ask, math.floor(out[4 * i] / 2))
        if code == 'f' or code == 'q' then
          spend = out[4 * i + 2]
          reserve_tail[4 * i - 1] = held[3 * i - 2]
        elseif code == 'k' then
          local window, precision = sw_spec(ARGV[3 * i + 4])
          local j = floor_div(now, precision)
          local stable = (floor_div(now - window, precision) + 1) * precision + window
          spend = math.min((j + 1) * precision, stable) - now
          reserve_tail[4 * i - 1] = j
        elseif code == 'w' then
          spend = fors[i]
          reserve_tail[4 * i - 1] = now + spend
        elseif code == 'b' then
          local capacity, rate = tonumber(ARGV[3 * i + 3]), tonumber(ARGV[3 * i + 4])
          local _, _, ids, list = b_read(KEYS[i])
          list = list or {}
          local outstanding, id = 0, now
          for _, r in ipairs(list) do
            if r[3] > now then
              outstanding = outstanding + r[2]
            end
            if r[1] >= id then
              id = r[1] + 1
            end
          end
          -- Until the tokens left and every reservation could refill to the capacity.
          local room = capacity * 1000000 - held[3 * i - 2] - outstanding * 1000000
          spend = math.min(fors[i], math.floor(room / rate))
          if spend < 1000 then
            g = 0
          end
          buckets[i] = { ids or '', list, id }
          reserve_tail[4 * i - 1] = id
        else
          g = 0
        end
        if g > 0 then
          out[4 * i] = out[4 * i] - g
        else
          spend = 0
        end
      end
      granted[i] = g
      reserve_tail[4 * i - 3] = g
      reserve_tail[4 * i - 2] = spend
    end
    return granted
  end

  -- After the commits: a log's reservation entry and a bucket's list.
  reserve_commit = function(granted, held)
    for i = 1, n do
      local g = granted[i]
      local code = code_of(i)
      if code == 'w' and g > 0 then
        local key, d = KEYS[i], reserve_tail[4 * i - 1]
        local head = redis.call('LINDEX', key, 0)
        redis.call('RPUSH', key, g == 1 and string.format('%d', d) or string.format('%d:%d', d, g))
        if g > 1 then
          if head and string.byte(head, 1) == 45 then
            local x, ids = string.match(head, '^%-(%d+):(.*)$')
            redis.call('LSET', key, 0, string.format('-%d:', tonumber(x) + g - 1) .. ids)
          else
            redis.call('LPUSH', key, string.format('-%d:', g - 1))
          end
        end
        redis.call('PEXPIRE', key, math.ceil((d + tonumber(ARGV[3 * i + 4]) - now) / 1000), 'GT')
      elseif code == 'b' and buckets[i] then
        local ids, list, id = buckets[i][1], buckets[i][2], buckets[i][3]
        local left = held[3 * i - 2] - g * 1000000
        if g > 0 then
          list[#list + 1] = { id, g, now + reserve_tail[4 * i - 2] }
          reserve_tail[4 * i] = left
        end
        b_write(KEYS[i], left, held[3 * i - 1], ids, list, tonumber(ARGV[3 * i + 3]), tonumber(ARGV[3 * i + 4]))
      end
    end
  end
end
