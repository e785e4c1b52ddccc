-- The floor of a sliding-window log check in Redis: only the commands a check
-- of one-unit entries sends (TIME, then per key LINDEX, LLEN, RPUSH, PEXPIRE),
-- with no logic and no reply table. `redis_callgrind.py` counts it next to the
-- real script, so that what the script adds to Redis's own work is visible.
--
-- KEYS = the logs (any number). Returns 1.
local t = redis.call('TIME')
local now = t[1] .. string.sub('00000' .. t[2], -6)
for i = 1, #KEYS do
  local k = KEYS[i]
  redis.pcall('LINDEX', k, '0')
  redis.call('LLEN', k)
  redis.call('RPUSH', k, now)
  redis.call('PEXPIRE', k, '60000')
end
return 1
