-- The most common call, answered in straight-line code before anything else
-- is set up: a check of cost 1 against one sliding-window rule on the
-- server's clock. Step for step what swl_decide and swl_commit do for it
-- (see sliding_window_log.lua); any other call goes on to the general driver.
if n == 1 and mode == 'c' and cost == 1 and monotonic and ARGV[5] == 'w' then
  local key = KEYS[1]
  local limit = tonumber(ARGV[6])
  local window = tonumber(ARGV[7])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local count = redis.call('ZCARD', key)
  if count < limit then
    redis.call('ZADD', key, now, call_id)
    redis.call('PEXPIRE', key, math.ceil(window / 1000))
    return { now, 0, 1, limit - count - 1, 0, window }
  end
  -- Denied: wait until the oldest member in the window has left it.
  local oldest = tonumber(redis.call('ZRANGE', key, count - limit, count - limit, 'WITHSCORES')[2])
  local newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
  return { now, 0, 0, limit - count, oldest + window - now, newest + window - now }
end
