-- Right after deadline.lua: the short forms of single-rule checks, modes "s" (and "t") and
-- "f" (below). Mode "s", the most common call, answered in
-- straight-line code before anything else is set up: a check of cost 1, with
-- no call id of the caller's, against one sliding-window rule that is not in
-- shadow mode. Its arguments are short:
--
-- KEYS = { the rule's key }
-- ARGV = { "s", call id, limit, window_us [, now_us] }  (or "t", below)
--   ARGV[5], optional: now in microseconds (an integer, read with tonumber
--   exactly as args.lua reads ARGV[2]); absent or "" reads the server clock
--   with TIME.
--
-- Mode "t" is the same check with a terse admission: the reply of an
-- admitted check is the bare integer `remaining` (its reset_after is the
-- window, its retry_after 0, as below), which spares Redis building and
-- sending a table; the client sends it when it needs no server time back
-- (its own clock, or the server's offset learned recently).
--
-- Returns the general form for one key (see args.lua): { now, 0, allowed,
-- remaining, retry_after_us, reset_after_us }, step for step what swl_decide
-- and swl_commit answer at cost 1 (see sliding_window_log.lua for the
-- list it reads and writes). Its common case only: anything else (a key of
-- an older version or of another kind, an entry newer than `now`, more
-- expired entries than it read, a denial that needs more than the oldest
-- unit) it hands, before writing anything, to the general path, by rewriting
-- ARGV into mode "n"'s form of the same check marked "N" (which the block
-- after mode "n" rewrites into the general form) and not returning. Defines
-- nothing: any other mode falls through to args.lua with no local left behind
-- (both short forms keep their locals inside their `if` blocks).
if ARGV[1] == 's' or ARGV[1] == 't' then
  local terse = ARGV[1] == 't'
  local key = KEYS[1]
  local now = ARGV[5]
  -- (`+ 0` reads a number argument with one conversion; tonumber makes two.)
  local limit = ARGV[3] + 0
  local window = ARGV[4] + 0
  local clock = now == nil or now == ''
  if clock then
    -- The server's clock (read by deadline.lua already when the call has a deadline).
    now = server_now
    if not now then
      local t = redis.call('TIME')
      now = t[1] * 1000000 + t[2]
    end
  else
    now = now + 0
  end
  -- The front of the log (see sliding_window_log.lua): a log without a
  -- header holds only checks of one unit, so its units are its length; with
  -- one, they are its entries plus the header's extra.
  local first = redis.pcall('LINDEX', key, '0')
  if not first then
    redis.call('RPUSH', key, string.format('%d', now))
    redis.call('PEXPIRE', key, string.format('%d', math.ceil(window / 1000)))
    if terse then
      return limit - 1
    end
    return { now, 0, 1, limit - 1, 0, window }
  end
  -- The usual front, a one-unit entry, reads as a number; a header
  -- ("-<extra>:<ids>"), an entry of more units ("<t>:<units>") or an error
  -- (a key of another kind) does not.
  local t = tonumber(first)
  local general = false
  local h, extra, ids, units = 0, 0, '', 1
  if not t then
    general = type(first) == 'table'
    local oldest = first
    if not general and string.byte(first, 1) == 45 then
      local e, i = string.match(first, '^%-(%d+):(.*)$')
      h, extra, ids = 1, tonumber(e), i
      oldest = redis.call('LINDEX', key, 1)
      -- (A header without entries, which no write leaves, is the general path's too.)
      general = not oldest
    end
    if not general then
      t = tonumber(oldest)
      if not t then
        local a, b = string.match(oldest, '^(%d+):(%d+)$')
        t, units = tonumber(a), tonumber(b)
      end
    end
  end
  if not general then
    local floor = now - window
    -- Drop the entries that have left the window, from the front (up to 8
    -- of them here; more, the general path does).
    local k = 0
    if t <= floor then
      local got = redis.call('LRANGE', key, h, h + 7)
      t = nil
      for j = 1, #got do
        local a, b = string.match(got[j], '^(%d+):?(%d*)$')
        a, b = tonumber(a), tonumber(b) or 1
        if a > floor then
          t, units = a, b
          break
        end
        k = k + 1
        extra = extra - (b - 1)
      end
      if t == nil and #got < 8 then
        -- All of it has left: the log starts again with this check.
        redis.call('DEL', key)
        redis.call('RPUSH', key, string.format('%d', now))
        redis.call('PEXPIRE', key, string.format('%d', math.ceil(window / 1000)))
        if terse then
          return limit - 1
        end
        return { now, 0, 1, limit - 1, 0, window }
      end
      general = t == nil
    end
    local newest
    if not general and not clock then
      -- The caller's clock: an entry newer than `now` needs an ordered insert.
      newest = tonumber(string.match(redis.call('LINDEX', key, -1), '^(%d+)'))
      general = newest > now
    end
    local count
    if not general then
      count = redis.call('LLEN', key) - h - k + extra
      -- A denial that needs more than the oldest entry's units is the
      -- general path's, unless every entry is one unit (no header).
      general = count >= limit and count - limit + 1 > units and h == 1
    end
    if not general then
      if count >= limit and count - limit + 1 > units then
        -- One unit per entry: the (count - limit + 1)-th oldest must leave.
        t = tonumber(redis.call('LINDEX', key, k + count - limit))
      end
      if k > 0 then
        redis.call('LTRIM', key, k, -1)
      end
      if count < limit then
        redis.call('RPUSH', key, string.format('%d', now))
      end
      if k > 0 and h == 1 then
        redis.call('LSET', key, 0, string.format('-%d:', extra) .. ids)
      end
      if count < limit then
        redis.call('PEXPIRE', key, string.format('%d', math.ceil(window / 1000)))
        if terse then
          return limit - count - 1
        end
        return { now, 0, 1, limit - count - 1, 0, window }
      end
      -- Denied: wait until the oldest units needed have left.
      newest = newest or tonumber(string.match(redis.call('LINDEX', key, -1), '^(%d+)'))
      return { now, 0, 0, 0, t + window - now, newest + window - now }
    end
  end
  -- Mode "n"'s arguments for the same check, marked "N": the block after
  -- mode "n" rewrites them into the general form.
  local limit_s, window_s = ARGV[3], ARGV[4]
  ARGV[1] = 'N'
  if clock then
    ARGV[3] = ''
  else
    ARGV[3] = ARGV[5]
  end
  ARGV[4] = limit_s
  ARGV[5] = window_s
end

-- Mode "n": stacked sliding-window log rules (two or more), none in shadow
-- mode, checked at cost 1 with no call id of the caller's, with the terse
-- admission of mode "t" for all of them at once:
--
-- KEYS = { the rules' keys }
-- ARGV = { "n", call id, now_us or "", limit_1, window_us_1, ..., limit_n, window_us_n }
--   now_us as mode "s"'s ARGV[5]: "" reads the server clock with TIME.
--
-- An admission is answered with one integer, every rule's `remaining` in
-- one number: remaining_1 + (limit_1 + 1) * (remaining_2 + (limit_2 + 1) *
-- (...)); each rule's reset_after is its window and its retry_after 0, as
-- in mode "t". The client sends "n" only when the product of the
-- (limit_i + 1) stays below 2^53, so the number is exact. It decides every
-- rule before it writes anything, step for step what swl_decide and
-- swl_commit do at cost 1 for logs of one-unit entries, then pushes `now`
-- onto every log. A denial (a rule at its limit) it answers in the general
-- form, { now, 0, then per rule allowed, remaining, retry_after,
-- reset_after }, recording nothing, as check.lua would for logs of one-unit
-- entries. Anything else (a key with a header or of another kind, an entry
-- newer than `now`, more expired entries than it read) it hands to the
-- general path, by marking its ARGV "N" (below: rewritten into the general
-- form of the same check), having written nothing but
-- the dropping of expired entries (which no reader can tell from their
-- being dropped by the general path). Defines nothing: its locals stay in
-- its `if` block.
if ARGV[1] == 'n' then
  local now = ARGV[3]
  local clock = now == ''
  if clock then
    now = server_now
    if not now then
      local t = redis.call('TIME')
      now = t[1] * 1000000 + t[2]
    end
  else
    now = now + 0
  end
  local rules = #KEYS
  local general = false
  local packed, base = 0, 1
  -- Per denying rule i, at 3i-2 .. 3i: its remaining, retry_after and reset_after.
  local denied
  for i = 1, rules do
    local key = KEYS[i]
    local limit = ARGV[2 * i + 2] + 0
    local window = ARGV[2 * i + 3] + 0
    local count = 0
    local first = redis.pcall('LINDEX', key, '0')
    if first then
      -- A one-unit entry reads as a number; a header, an entry of more
      -- units or an error (a key of another kind) does not.
      local t = tonumber(first)
      if not t then
        general = true
        break
      end
      local floor = now - window
      local k = 0
      if t <= floor then
        -- Drop the entries that have left the window (up to 8 here).
        local got = redis.call('LRANGE', key, 0, 7)
        t = nil
        for j = 1, #got do
          local a = tonumber(got[j])
          if not a then
            general = true
            break
          end
          if a > floor then
            t = a
            break
          end
          k = k + 1
        end
        if general or (t == nil and #got == 8) then
          general = true
          break
        end
        if t == nil then
          -- All of it has left: the log starts again with this check.
          redis.call('DEL', key)
        else
          redis.call('LTRIM', key, k, -1)
        end
      end
      if t then
        local newest
        if not clock then
          -- The caller's clock: an entry newer than `now` needs an ordered insert.
          newest = tonumber(redis.call('LINDEX', key, -1))
          if not newest or newest > now then
            general = true
            break
          end
        end
        count = redis.call('LLEN', key)
        if count >= limit then
          -- Denied by this rule: the (count - limit + 1)-th oldest entry must
          -- leave; the log resets when its newest has left.
          local oldest = t
          if count > limit then
            oldest = tonumber(redis.call('LINDEX', key, count - limit))
          end
          newest = newest or tonumber(redis.call('LINDEX', key, -1))
          if not (oldest and newest) or count == 0 then
            general = true
            break
          end
          denied = denied or {}
          denied[3 * i - 2] = limit - count
          denied[3 * i - 1] = oldest + window - now
          denied[3 * i] = newest + window - now
          count = limit - 1
        end
      end
    end
    packed = packed + (limit - count - 1) * base
    base = base * (limit + 1)
  end
  if denied and not general then
    -- Nothing is recorded: the general reply, every rule decided as
    -- swl_decide does at cost 1 (an admitting rule keeps its remaining
    -- without the cost; its reset_after is the window).
    local out = { now, 0 }
    for i = 1, rules do
      local limit = ARGV[2 * i + 2] + 0
      local digit = packed % (limit + 1)
      packed = (packed - digit) / (limit + 1)
      local at = 4 * i - 1
      if denied[3 * i - 2] then
        out[at], out[at + 1], out[at + 2], out[at + 3] = 0, denied[3 * i - 2], denied[3 * i - 1], denied[3 * i]
      else
        out[at], out[at + 1], out[at + 2], out[at + 3] = 1, digit + 1, 0, ARGV[2 * i + 3] + 0
      end
    end
    return out
  end
  if not general then
    local stamp = string.format('%d', now)
    -- (Stacked rules often share a window: its expiry is formatted once.)
    local window, ms
    for i = 1, rules do
      local key = KEYS[i]
      redis.call('RPUSH', key, stamp)
      if ARGV[2 * i + 3] ~= window then
        window = ARGV[2 * i + 3]
        ms = string.format('%d', math.ceil(window / 1000))
      end
      redis.call('PEXPIRE', key, ms)
    end
    return packed
  end
  ARGV[1] = 'N'
end

-- "N": mode "n"'s arguments of a check that modes "s", "t" and "n" hand to
-- the general path (never sent by the core), rewritten into the general form
-- of the same check (args.lua) for check.lua to answer.
if ARGV[1] == 'N' then
  local rules = #KEYS
  local spec = {}
  for i = 1, rules do
    spec[2 * i - 1] = ARGV[2 * i + 2]
    spec[2 * i] = ARGV[2 * i + 3]
  end
  local call_id = ARGV[2]
  ARGV[1] = 'c'
  ARGV[2] = ARGV[3]
  ARGV[3] = call_id
  ARGV[4] = '1'
  for i = 1, rules do
    ARGV[3 * i + 2] = 'w'
    ARGV[3 * i + 3] = spec[2 * i - 1]
    ARGV[3 * i + 4] = spec[2 * i]
  end
end

-- Mode "f": the same for one fixed-window rule that is not in shadow mode,
-- at any cost, with no call id of the caller's (mode "i": the same with a
-- terse admission, below):
--
-- KEYS = { the rule's key }
-- ARGV = { "f", limit, window_us, cost [, now_us] }
--   ARGV[5], optional: now in microseconds; absent or "" reads TIME.
--
-- Mode "i" (the same arguments after "i") answers an admission whose
-- reset_after is at most the window with the bare integer
-- reset_after_us * (limit + 1) + remaining, as mode "t" does for a log;
-- the client sends it only when that stays below 2^53.
--
-- Returns { now, 0, allowed, remaining, retry_after_us, reset_after_us },
-- step for step what pc_decide and pc_commit answer for code "f" (see
-- period_counter.lua): the stored "<end>:<units>[:ids]" holds while its
-- period runs, a later stored period stays the period, and an admission
-- keeps the ids already there.
if ARGV[1] == 'f' or ARGV[1] == 'i' then
  local terse = ARGV[1] == 'i'
  local key = KEYS[1]
  local limit = ARGV[2] + 0
  local window = ARGV[3] + 0
  local cost = ARGV[4] + 0
  local now = ARGV[5]
  if now == nil or now == '' then
    now = server_now
    if not now then
      local t = redis.call('TIME')
      now = t[1] * 1000000 + t[2]
    end
  else
    now = now + 0
  end
  -- floor(now / window), exact (as floor_div in args.lua).
  local q = math.floor(now / window)
  if q * window > now then
    q = q - 1
  elseif (q + 1) * window <= now then
    q = q + 1
  end
  local end_us = (q + 1) * window
  local count, rest = 0, ''
  local stored = redis.call('GET', key)
  if stored then
    local e, c, r = string.match(stored, '^(%d+):(%d+)(.*)$')
    e = e + 0
    if e > now then
      count = c + 0
      rest = r
      if e > end_us then
        end_us = e
      end
    end
  end
  if count + cost <= limit then
    redis.call('SET', key, string.format('%d:%d', end_us, count + cost) .. rest, 'PX',
      string.format('%d', math.max(1, math.ceil((end_us - now) / 1000))))
    if terse and end_us - now <= window then
      -- Mode "i": reset_after and remaining in one integer (exact: the
      -- client sends "i" only when window * (limit + 1) + limit < 2^53).
      return (end_us - now) * (limit + 1) + limit - count - cost
    end
    return { now, 0, 1, limit - count - cost, 0, end_us - now }
  end
  return { now, 0, 0, limit - count, end_us - now, end_us - now }
end
