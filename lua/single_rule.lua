-- First in the script. Mode "s", the most common call, answered in
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
-- nothing: any other mode falls through to args.lua with no local left behind.
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
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
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
