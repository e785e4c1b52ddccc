-- Fourth in the script. Token bucket: `capacity` tokens, refilled
-- continuously at `rate` tokens per second, starting full. Reads
-- `uses_bucket` (args.lua) and defines three locals, made only when a rule of
-- this call is a bucket (nil otherwise): tb_wait(need, rate), for tb_decide,
-- and, for check.lua, tb_decide(key, now, cost, capacity, rate) and
-- tb_commit(key, stamp, left, reset_after, call_id, previous).
--
-- Tokens are counted in micro-tokens (1 token = 1,000,000) so that the stored
-- state is two integers: "<micro-tokens>:<last update in microseconds>",
-- followed, when calls carry ids to deduplicate, by ":" and the ids of the
-- last 64 admitted calls (comma-separated, newest last). In
-- these units the refill rate in micro-tokens per microsecond is numerically
-- the rate in tokens per second, so a refill is one multiplication. Only an
-- admitted request writes, so the state is only read on a denial. The
-- stored string is built with string.format('%d'), because Lua's own
-- number-to-string conversion keeps only 14 significant digits.

local tb_wait, tb_decide, tb_commit
if uses_bucket then
  -- Microseconds until `need` micro-tokens have been refilled at `rate`.
  tb_wait = function(need, rate)
    if need <= 0 then
      return 0
    end
    local wait = math.ceil(need / rate)
    if math.floor(wait * rate) < need then
      wait = wait + 1
    end
    return wait
  end

  -- Decide one rule. Returns allowed (0/1), remaining, retry_after,
  -- reset_after, the micro-tokens left after the request, the time stamp to
  -- store and the stored state as read (for tb_commit). The stamp never moves
  -- backwards, so a clock that steps back cannot refill the same interval twice.
  -- The micro-tokens stored may be below zero after a settle's debit
  -- (settle.lua): they refill from there like any others.
  tb_decide = function(key, now, cost, capacity, rate)
    local full = capacity * 1000000
    local tokens = full
    local stamp = now
    local stored = redis.call('GET', key)
    if stored then
      local t, ts = string.match(stored, '^(-?%d+):(%d+)')
      tokens = tonumber(t)
      local last = tonumber(ts)
      if last > now then
        stamp = last
      end
      if now > last then
        local refill = math.floor((now - last) * rate)
        if refill >= full - tokens then
          tokens = full
        else
          tokens = tokens + refill
        end
      end
    end
    local want = cost * 1000000
    if tokens >= want then
      local left = tokens - want
      return 1, math.floor(left / 1000000), 0, tb_wait(full - left, rate), left, stamp, stored
    end
    return 0, math.floor(tokens / 1000000), tb_wait(want - tokens, rate), tb_wait(full - tokens, rate), tokens, stamp, stored
  end

  -- Store the bucket after an admission. The key expires when the bucket would
  -- be full again, which is the same as the key being absent. The ids of
  -- earlier calls (`previous`, the state as decided) are kept; a call id joins
  -- them, and the oldest drops out after 64.
  tb_commit = function(key, stamp, left, reset_after, call_id, previous)
    local stored = string.format('%d:%d', left, stamp)
    local kept = previous and string.match(previous, '^-?%d+:%d+:(.*)$')
    if call_id or kept then
      local list = ids_push(kept, call_id)
      if list then
        stored = stored .. ':' .. list
      end
    end
    redis.call('SET', key, stored, 'PX', math.max(1, math.ceil(reset_after / 1000)))
  end
end
