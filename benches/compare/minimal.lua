-- The ceiling: the least a single-key sliding-window log can do in Redis
-- (the reference the comparison measures throttlegate's script against).
--
-- KEYS[1] the log (a sorted set, one member per admitted request)
-- ARGV[1] limit, ARGV[2] window in microseconds, ARGV[3] a member unique to
-- this call. Reads the server clock; returns 1 when admitted, 0 when denied.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now, ARGV[3])
  redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000))
  return 1
end
return 0
