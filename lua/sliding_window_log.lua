-- Third in the script. Sliding-window log: `limit` units per `window`
-- microseconds. Reads `uses_log` (args.lua) and defines two locals for
-- check.lua, made only when a rule of this call is a log (nil otherwise):
-- swl_decide(key, now, cost, limit, window, monotonic) and
-- swl_commit(key, now, cost, reset_after, call_id). Mode "s"
-- (single_rule.lua) is the same arithmetic at cost 1, written out.
--
-- The log is a sorted set with one member per admitted unit, scored by the
-- admission time in microseconds. A member with score `s` is inside the window
-- while `now < s + window`. Deciding first drops the members that have left
-- the window (invisible to every reader, so a denial or a peek still changes
-- nothing that can be observed); `swl_commit` is the only other writer and
-- runs only after every rule of the check has passed.
--
-- Every time value is an integer number of microseconds (exact in a double
-- below 2^53), and every value returned is an integer. Numbers handed to
-- redis.call travel exactly (Redis prints them with 17 significant digits),
-- so timestamps are passed as numbers.

local swl_decide, swl_commit
if uses_log then
  -- Decide one rule. Returns allowed (0/1), remaining, retry_after and
  -- reset_after. With `monotonic` (the server's own clock), no member can be
  -- newer than `now`, so an admission's reset_after is the window without
  -- looking the newest member up.
  swl_decide = function(key, now, cost, limit, window, monotonic)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
    local count = redis.call('ZCARD', key)
    if count + cost <= limit then
      -- Admitted: the newest member will be `now`, or a later one written by a
      -- client whose clock is ahead (client time); a peek at cost 0 adds nothing.
      local reset_after = 0
      if cost > 0 then
        reset_after = window
      end
      if count > 0 and not (monotonic and cost > 0) then
        local newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]) + window - now
        if newest > reset_after then
          reset_after = newest
        end
      end
      return 1, limit - count - cost, 0, reset_after
    end
    -- Denied: wait until the `need` oldest members have left the window.
    local need = count + cost - limit
    local retry_after = tonumber(redis.call('ZRANGE', key, need - 1, need - 1, 'WITHSCORES')[2]) + window - now
    local reset_after = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]) + window - now
    return 0, limit - count, retry_after, reset_after
  end

  -- Record `cost` admitted units at `now`; the key expires when the log would
  -- be empty. Members are derived from the caller's random call id, so they are
  -- unique without any randomness inside Redis, and a re-sent call can be
  -- recognised (see `seen`).
  swl_commit = function(key, now, cost, reset_after, call_id)
    if cost == 1 then
      redis.call('ZADD', key, now, call_id)
    else
      local args = { now, call_id }
      for i = 2, cost do
        args[#args + 1] = now
        args[#args + 1] = call_id .. ':' .. i
        -- Keep each ZADD well under Lua's C stack limit for unpack().
        if #args == 2000 then
          redis.call('ZADD', key, unpack(args))
          args = {}
        end
      end
      if #args > 0 then
        redis.call('ZADD', key, unpack(args))
      end
    end
    redis.call('PEXPIRE', key, math.ceil(reset_after / 1000))
  end
end
