-- Token bucket: `capacity` tokens, refilled continuously at `rate` tokens per
-- second, starting full.
--
-- Tokens are counted in micro-tokens (1 token = 1,000,000) so that the stored
-- state is two integers: "<micro-tokens>:<last update in microseconds>",
-- followed, when calls carry ids to deduplicate, by ":" and the ids of the
-- last TB_IDS admitted calls (comma-separated, newest last). In
-- these units the refill rate in micro-tokens per microsecond is numerically
-- the rate in tokens per second, so a refill is one multiplication. Only an
-- admitted request writes, so the state is only read on a denial.

local MICRO = 1000000
local TB_IDS = 64

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
-- reset_after, the micro-tokens left after the request, the time stamp to
-- store and the stored state as read (for tb_commit). The stamp never moves backwards, so a clock that
-- steps back cannot refill the same interval twice.
local function tb_decide(key, now, cost, capacity, rate)
  local full = capacity * MICRO
  local tokens = full
  local stamp = now
  local stored = redis.call('GET', key)
  if stored then
    local t, ts = string.match(stored, '^(%d+):(%d+)')
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
  local want = cost * MICRO
  if tokens >= want then
    local left = tokens - want
    return 1, math.floor(left / MICRO), 0, tb_wait(full - left, rate), left, stamp, stored
  end
  return 0, math.floor(tokens / MICRO), tb_wait(want - tokens, rate), tb_wait(full - tokens, rate), tokens, stamp, stored
end

-- The call ids recorded in a stored bucket ("" when none).
local function tb_ids(stored)
  return string.match(stored, '^%d+:%d+:(.*)$') or ''
end

-- True when the call `call_id` is one of the last admissions recorded in
-- this bucket (a re-sent call that Redis had executed).
local function tb_seen(key, call_id)
  local stored = redis.call('GET', key)
  if not stored then
    return false
  end
  for id in string.gmatch(tb_ids(stored), '[^,]+') do
    if id == call_id then
      return true
    end
  end
  return false
end

-- Store the bucket after an admission. The key expires when the bucket would
-- be full again, which is the same as the key being absent. The ids of
-- earlier calls (`previous`, the state as decided) are kept; a call id joins
-- them, and the oldest drops out after TB_IDS.
local function tb_commit(key, stamp, left, reset_after, call_id, previous)
  local stored = string.format('%d:%d', left, stamp)
  local ids = {}
  if previous then
    for id in string.gmatch(tb_ids(previous), '[^,]+') do
      ids[#ids + 1] = id
    end
  end
  if call_id then
    ids[#ids + 1] = call_id
  end
  if #ids > 0 then
    local first = math.max(1, #ids - TB_IDS + 1)
    stored = stored .. ':' .. table.concat(ids, ',', first, #ids)
  end
  redis.call('SET', key, stored, 'PX', int(math.max(1, math.ceil(reset_after / 1000))))
end

-- Give back `cost` tokens taken by the call `call_id` (Redis Cluster: another
-- slot of the same check denied it). The id leaves the list as the tokens
-- come back, so a re-sent give-back cannot refund twice; a call whose id has
-- already dropped out of the list is not refunded (a brief over-restriction,
-- never an over-admission).
local function tb_undo(key, cost, capacity, call_id)
  local stored = redis.call('GET', key)
  if not stored then
    return
  end
  local t, ts = string.match(stored, '^(%d+):(%d+)')
  local kept = {}
  local found = false
  for id in string.gmatch(tb_ids(stored), '[^,]+') do
    if id == call_id and not found then
      found = true
    else
      kept[#kept + 1] = id
    end
  end
  if not found then
    return
  end
  local tokens = math.min(capacity * MICRO, tonumber(t) + cost * MICRO)
  local value = string.format('%d:%s', tokens, ts)
  if #kept > 0 then
    value = value .. ':' .. table.concat(kept, ',')
  end
  redis.call('SET', key, value, 'KEEPTTL')
end
