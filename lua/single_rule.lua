-- Mode "s", the most common call, answered in straight-line code before
-- anything else is set up: a check of cost 1, with no call id of the
-- caller's, against one sliding-window rule that is not in shadow mode, on
-- the server's clock. Its arguments are short:
--
-- ARGV = { "s", call id, limit, window_us }, KEYS = { the rule's key }
--
-- and its answer has the general form (see args.lua). Step for step what
-- swl_decide and swl_commit do for it (see sliding_window_log.lua).
if ARGV[1] == 's' then
  local key = KEYS[1]
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local limit = tonumber(ARGV[3])
  local window = tonumber(ARGV[4])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local count = redis.call('ZCARD', key)
  if count < limit then
    redis.call('ZADD', key, now, ARGV[2])
    redis.call('PEXPIRE', key, math.ceil(window / 1000))
    return { now, 0, 1, limit - count - 1, 0, window }
  end
  -- Denied: wait until the oldest member in the window has left it.
  local oldest = tonumber(redis.call('ZRANGE', key, count - limit, count - limit, 'WITHSCORES')[2])
  local newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
  return { now, 0, 0, limit - count, oldest + window - now, newest + window - now }
end
