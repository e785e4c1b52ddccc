-- Sliding-window log: `limit` units per `window` microseconds.
--
-- The log is a sorted set with one member per admitted unit, scored by the
-- admission time in microseconds. A member with score `s` is inside the window
-- while `now < s + window`. Deciding is read-only; `swl_commit` is the only
-- writer and runs only after every rule of the check has passed.
--
-- Every time value is an integer number of microseconds (exact in a double
-- below 2^53), and every value returned is an integer.

-- Decide one rule. Returns allowed (0/1), remaining, retry_after, reset_after
-- and the current count (needed by swl_commit). With `monotonic` (the server's
-- own clock), no member can be newer than `now`, so an admission's
-- reset_after is the window without looking the newest member up.
local function swl_decide(key, now, cost, limit, window, monotonic)
  local floor_score = now - window
  local count = redis.call('ZCOUNT', key, '(' .. int(floor_score), '+inf')
  if count + cost <= limit then
    -- Admitted: the newest member will be `now`, or a later one written by a
    -- client whose clock is ahead (client time); a peek at cost 0 adds nothing.
    local reset_after = 0
    if cost > 0 then
      reset_after = window
    end
    if count > 0 and not (monotonic and cost > 0) then
      local newest = redis.call('ZRANGE', key, '+inf', '(' .. int(floor_score), 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')
      local newest_reset = tonumber(newest[2]) + window - now
      if newest_reset > reset_after then
        reset_after = newest_reset
      end
    end
    return 1, limit - count - cost, 0, reset_after, count
  end
  -- Denied: wait until the `need` oldest members have left the window.
  local need = count + cost - limit
  local nth = redis.call('ZRANGE', key, '(' .. int(floor_score), '+inf', 'BYSCORE', 'LIMIT', need - 1, 1, 'WITHSCORES')
  local retry_after = tonumber(nth[2]) + window - now
  local newest = redis.call('ZRANGE', key, '+inf', '(' .. int(floor_score), 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')
  local reset_after = tonumber(newest[2]) + window - now
  return 0, limit - count, retry_after, reset_after, count
end

-- True when the call `call_id` was already recorded in this log (a re-sent
-- call that Redis had executed).
local function swl_seen(key, call_id)
  return redis.call('ZSCORE', key, call_id) ~= false
end

-- Record `cost` admitted units at `now` and drop the members that left the
-- window; the key expires when the log would be empty. Members are derived from the caller's random call id, so they are
-- unique without any randomness inside Redis, and a re-sent call can be
-- recognised by `swl_decide`.
local function swl_commit(key, now, cost, window, reset_after, call_id)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - window))
  local score = int(now)
  local args = { score, call_id }
  local n = 1
  for i = 2, cost do
    args[#args + 1] = score
    args[#args + 1] = call_id .. ':' .. i
    n = n + 1
    -- Keep each ZADD well under Lua's C stack limit for unpack().
    if n == 1000 then
      redis.call('ZADD', key, unpack(args))
      args = {}
      n = 0
    end
  end
  if #args > 0 then
    redis.call('ZADD', key, unpack(args))
  end
  redis.call('PEXPIRE', key, int(math.ceil(reset_after / 1000)))
end

-- Give back what `swl_commit` recorded for the call `call_id` (Redis
-- Cluster: another slot of the same check denied it).
local function swl_undo(key, cost, call_id)
  local members = { call_id }
  for i = 2, cost do
    members[#members + 1] = call_id .. ':' .. i
    if #members == 1000 then
      redis.call('ZREM', key, unpack(members))
      members = {}
    end
  end
  if #members > 0 then
    redis.call('ZREM', key, unpack(members))
  end
end
