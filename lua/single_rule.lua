-- Right after deadline.lua: the short forms of single-rule checks, modes "s" and
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
-- and swl_commit answer at cost 1 (see sliding_window_log.lua). Defines
-- nothing: any other mode falls through to args.lua with no local left behind
-- (both short forms keep their locals inside their `if` blocks).
if ARGV[1] == 's' then
  local key = KEYS[1]
  local now = ARGV[5]
  local limit = tonumber(ARGV[3])
  local window = tonumber(ARGV[4])
  local reset_after = window
  local count
  if now == nil or now == '' then
    -- The server's clock: no member can be newer than `now`, so an admission
    -- resets after exactly the window.
    now = server_now
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
    count = redis.call('ZCARD', key)
  else
    -- The caller's clock: members written at a later time may be newer than
    -- `now`, so an admission looks the newest up, as swl_decide does when
    -- not `monotonic`.
    now = tonumber(now)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
    count = redis.call('ZCARD', key)
    if count > 0 and count < limit then
      local newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]) + window - now
      if newest > reset_after then
        reset_after = newest
      end
    end
  end
  if count < limit then
    redis.call('ZADD', key, now, ARGV[2])
    redis.call('PEXPIRE', key, math.ceil(reset_after / 1000))
    return { now, 0, 1, limit - count - 1, 0, reset_after }
  end
  -- Denied: wait until the oldest member in the window has left it.
  local oldest = tonumber(redis.call('ZRANGE', key, count - limit, count - limit, 'WITHSCORES')[2])
  local newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
  return { now, 0, 0, limit - count, oldest + window - now, newest + window - now }
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
    now = server_now
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
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
