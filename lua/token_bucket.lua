-- Token bucket: `capacity` tokens, refilled continuously at `rate` tokens per
-- second, starting full.
--
-- Tokens are counted in micro-tokens (1 token = 1,000,000) so that the stored
-- state is two integers: "<micro-tokens>:<last update in microseconds>". In
-- these units the refill rate in micro-tokens per microsecond is numerically
-- the rate in tokens per second, so a refill is one multiplication. Only an
-- admitted request writes, so the state is only read on a denial.

local MICRO = 1000000

-- Microseconds until `need` micro-tokens have been refilled at `rate`.
local function tb_wait(need, rate)
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
-- reset_after, and the micro-tokens left after the request (for tb_commit).
local function tb_decide(key, now, cost, capacity, rate)
  local full = capacity * MICRO
  local tokens = full
  local stored = redis.call('GET', key)
  if stored then
    local t, ts = string.match(stored, '^(%d+):(%d+)')
    tokens = tonumber(t)
    local last = tonumber(ts)
    if now > last then
      local refill = math.floor((now - last) * rate)
      if refill >= full - tokens then
        tokens = full
      else
        tokens = tokens + refill
      end
    end
  end
  local want = cost * MICRO
  if tokens >= want then
    local left = tokens - want
    return 1, math.floor(left / MICRO), 0, tb_wait(full - left, rate), left
  end
  return 0, math.floor(tokens / MICRO), tb_wait(want - tokens, rate), tb_wait(full - tokens, rate), tokens
end

-- True when the last admission recorded in this bucket was the call
-- `call_id` (a re-sent call that Redis had executed).
local function tb_seen(key, call_id)
  local stored = redis.call('GET', key)
  return stored ~= false and string.match(stored, '^%d+:%d+:(.*)$') == call_id
end

-- Store the bucket after an admission. The key expires when the bucket would
-- be full again, which is the same as the key being absent.
local function tb_commit(key, now, left, reset_after, dedupe_id)
  local stored = string.format('%d:%d', left, now)
  if dedupe_id then
    stored = stored .. ':' .. dedupe_id
  end
  redis.call('SET', key, stored, 'PX', int(math.max(1, math.ceil(reset_after / 1000))))
end
