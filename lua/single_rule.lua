-- First in the script: the short forms of single-rule checks, modes "s" and
-- "f" (below). Mode "s", the most common call, answered in
-- straight-line code before anything else is set up: a check of cost 1, with
-- no call id of the caller's, against one sliding-window rule that is not in
-- shadow mode. Its arguments are short:
--
-- KEYS = { the rule's key }
-- ARGV = { "s", call id, limit, window_us [, now_us] }
--   ARGV[5], optional: now in microseconds (an integer, read with tonumber
--   exactly as args.lua reads ARGV[2]); absent or "" reads the server clock
--   with TIME.
--
-- Returns the general form for one key (see args.lua): { now, 0, allowed,
-- remaining, retry_after_us, reset_after_us }, step for step what swl_decide
-- and swl_commit answer at cost 1 (see sliding_window_log.lua for the
-- list it reads and writes). Its common case only: anything else (a key of
-- an older version or of another kind, an entry newer than `now`, more
-- expired entries than it read, a denial that needs more than the oldest
-- unit) it hands, before writing anything, to the general path, by rewriting
-- ARGV into the general form of the same check and not returning. Defines
-- nothing: any other mode falls through to args.lua with no local left behind
-- (both short forms keep their locals inside their `if` blocks).
if ARGV[1] == 's' then
  local key = KEYS[1]
  local now = ARGV[5]
  local limit = tonumber(ARGV[3])
  local window = tonumber(ARGV[4])
  local clock = now == nil or now == ''
  if clock then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  else
    now = tonumber(now)
  end
  -- The header and the oldest entries (see sliding_window_log.lua).
  local got = redis.pcall('LRANGE', key, 0, 3)
  local total, newest, ids, general = 0, 0, '', false
  if got.err then
    -- Not a log of this version (a sorted set of an older one, which the
    -- general path converts, or another kind of key, which it refuses).
    general = true
  elseif got[1] then
    local t, nw, i = string.match(got[1], '^(%d+):(%d+):(.*)$')
    total, newest, ids = tonumber(t), tonumber(nw), i
    -- An entry newer than `now` (the caller's clock) needs an ordered insert.
    general = newest > now
  end
  if not general then
    -- Drop the entries that have left the window, from the front; when more
    -- than those read have left, the general path does it.
    local floor = now - window
    local k, first_t = 0, nil
    while total > 0 do
      local e = got[k + 2]
      if e == nil then
        general = true
        break
      end
      local et, ec = string.match(e, '^(%d+):?(%d*)$')
      et = tonumber(et)
      if et > floor then
        first_t = et
        break
      end
      total = total - (tonumber(ec) or 1)
      k = k + 1
    end
    -- A denial that needs more than the oldest unit (a limit lowered below
    -- the units stored) is also the general path's.
    if not general and (total < limit or total == limit) then
      if k > 0 then
        if total == 0 then
          redis.call('DEL', key)
          ids = ''
        else
          redis.call('LTRIM', key, k, -1)
        end
      end
      if total < limit then
        if total == 0 then
          redis.call('RPUSH', key, string.format('%d:%d:', 1, now) .. ids, string.format('%d', now))
        else
          redis.call('RPUSH', key, string.format('%d', now))
          redis.call('LSET', key, 0, string.format('%d:%d:', total + 1, now) .. ids)
        end
        redis.call('PEXPIRE', key, math.ceil(window / 1000))
        return { now, 0, 1, limit - total - 1, 0, window }
      end
      -- Denied: wait until the oldest entry has left the window.
      if k > 0 then
        redis.call('LSET', key, 0, string.format('%d:%d:', total, newest) .. ids)
      end
      return { now, 0, 0, 0, first_t + window - now, newest + window - now }
    end
  end
  -- The general form of the same check (args.lua), for check.lua to answer.
  local call_id = ARGV[2]
  ARGV[1] = 'c'
  if clock then
    ARGV[2] = ''
  else
    ARGV[2] = ARGV[5]
  end
  ARGV[3] = call_id
  ARGV[4] = '1'
  ARGV[5] = 'w'
  ARGV[6] = string.format('%d', limit)
  ARGV[7] = string.format('%d', window)
end

-- Mode "f": the same for one fixed-window rule that is not in shadow mode,
-- at any cost, with no call id of the caller's:
--
-- KEYS = { the rule's key }
-- ARGV = { "f", limit, window_us, cost [, now_us] }
--   ARGV[5], optional: now in microseconds; absent or "" reads TIME.
--
-- Returns { now, 0, allowed, remaining, retry_after_us, reset_after_us },
-- step for step what pc_decide and pc_commit answer for code "f" (see
-- period_counter.lua): the stored "<end>:<units>[:ids]" holds while its
-- period runs, a later stored period stays the period, and an admission
-- keeps the ids already there.
if ARGV[1] == 'f' then
  local key = KEYS[1]
  local limit = tonumber(ARGV[2])
  local window = tonumber(ARGV[3])
  local cost = tonumber(ARGV[4])
  local now = ARGV[5]
  if now == nil or now == '' then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  else
    now = tonumber(now)
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
    e = tonumber(e)
    if e > now then
      count = tonumber(c)
      rest = r
      if e > end_us then
        end_us = e
      end
    end
  end
  if count + cost <= limit then
    redis.call('SET', key, string.format('%d:%d', end_us, count + cost) .. rest, 'PX',
      math.max(1, math.ceil((end_us - now) / 1000)))
    return { now, 0, 1, limit - count - cost, 0, end_us - now }
  end
  return { now, 0, 0, limit - count, end_us - now, end_us - now }
end
