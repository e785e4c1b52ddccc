-- The least a fixed-window counter can do in Redis (the reference the
-- comparison measures throttlegate's fixed window against): INCR, then
-- PEXPIRE ... NX, which sets the window's expiry only on the key's first
-- increment (Redis >= 7).
--
-- KEYS[1] the counter, ARGV[1] window in milliseconds, ARGV[2] limit.
-- Returns 1 when within the limit, 0 otherwise (it counts either way).
local n = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[1], 'NX')
if n <= tonumber(ARGV[2]) then
  return 1
end
return 0
