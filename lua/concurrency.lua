-- Seventh in the script. Concurrency rules ("l", limit, lease_us; "L" in
-- shadow mode): per key a sorted set with one member per slot held, scored by
-- the end of its lease in microseconds: the lease id (the call id ARGV[3])
-- for a lease's first slot, "<id>#<k>" for its k-th (k = 2 .. cost), so a
-- key holds at most `limit` members. A slot counts while its end > now;
-- expired members are removed whenever the key is written, and the key
-- expires when its latest lease ends. Ids are [A-Za-z0-9_-], so "#" cannot
-- be part of one. Reads `uses_lease`, `mode`, `now`, `call_id`, `cost` and
-- `n` (args.lua) and defines, made only when a rule of this call is one (nil
-- otherwise): cc_decide(key, now, cost, limit, lease) -> allowed, remaining,
-- retry_after, reset_after; cc_commit(key, now, cost, lease, id, reset_after);
-- cc_seen(key, id) (the lease holds slots now) and cc_drop(key, id) (release,
-- and the Redis Cluster give-back: 1 when the lease held slots). It answers
-- modes "r" (release lease call_id on every key) and "e" (extend it: its
-- slots still held end ARGV[4] microseconds from now; an expired or released
-- lease is never brought back) itself, returning { now, 0, then 1/0 per key }.
-- Numbers sent to Redis are written with string.format('%d'): Lua's own
-- conversion keeps only 14 significant digits.

local cc_decide, cc_commit, cc_seen, cc_drop, cc_extend
if uses_lease then
  local function fmt(x)
    return string.format('%d', x)
  end

  -- The members of lease `id` (they share its score) and their end, or nil.
  local function members(key, id)
    local s = redis.call('ZSCORE', key, id)
    if not s then
      return nil
    end
    local found = { id }
    local prefix = id .. '#'
    for _, m in ipairs(redis.call('ZRANGE', key, s, s, 'BYSCORE')) do
      if string.sub(m, 1, #prefix) == prefix then
        found[#found + 1] = m
      end
    end
    return found, tonumber(s)
  end

  -- ZADD (with `flag`, or none) of members, all scored `score`, in chunks.
  local function add_all(key, flag, score, list)
    local args = {}
    for _, m in ipairs(list) do
      args[#args + 1] = score
      args[#args + 1] = m
      if #args >= 200 then
        if flag then redis.call('ZADD', key, flag, unpack(args)) else redis.call('ZADD', key, unpack(args)) end
        args = {}
      end
    end
    if #args > 0 then
      if flag then redis.call('ZADD', key, flag, unpack(args)) else redis.call('ZADD', key, unpack(args)) end
    end
  end

  -- The key lives until its latest lease ends.
  local function expire_at_latest(key)
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if #last > 0 then
      redis.call('PEXPIRE', key, math.max(1, math.ceil((tonumber(last[2]) - now) / 1000)))
    end
  end

  cc_decide = function(key, now, cost, limit, lease)
    local live = '(' .. fmt(now)
    local count = redis.call('ZCOUNT', key, live, '+inf')
    local reset = 0
    if count > 0 then
      local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      reset = tonumber(last[2]) - now
    end
    if count + cost <= limit then
      if cost > 0 and lease > reset then
        reset = lease
      end
      return 1, limit - count - cost, 0, reset
    end
    -- Denied: wait until the slot that brings the count low enough ends
    -- (a release may come sooner).
    local need = count + cost - limit
    local nth = redis.call('ZRANGE', key, live, '+inf', 'BYSCORE', 'LIMIT', need - 1, 1, 'WITHSCORES')
    return 0, math.max(limit - count, 0), tonumber(nth[2]) - now, reset
  end

  -- `reset_after` (cc_decide's, admitted) is the time until the latest lease
  -- ends, this one's included: the key's TTL, without reading it again.
  cc_commit = function(key, now, cost, lease, id, reset_after)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
    local list = { id }
    for k = 2, cost do
      list[k] = id .. '#' .. k
    end
    add_all(key, nil, fmt(now + lease), list)
    redis.call('PEXPIRE', key, math.max(1, math.ceil(reset_after / 1000)))
  end

  cc_seen = function(key, id)
    local s = redis.call('ZSCORE', key, id)
    return s ~= false and s ~= nil and tonumber(s) > now
  end

  cc_drop = function(key, id)
    local found, ends = members(key, id)
    if found then
      for i = 1, #found, 200 do
        redis.call('ZREM', key, unpack(found, i, math.min(#found, i + 199)))
      end
    end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
    if found and ends > now then
      return 1
    end
    return 0
  end

  cc_extend = function(key, id, duration)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
    local found = members(key, id)
    if not found then
      return 0
    end
    add_all(key, 'XX', fmt(now + duration), found)
    expire_at_latest(key)
    return 1
  end
end

if mode == 'r' or mode == 'e' then
  local out = { now, 0 }
  for i = 1, n do
    local code = ARGV[3 * i + 2]
    if code ~= 'l' and code ~= 'L' then
      return redis.error_reply('ERR throttlegate: not a concurrency rule code ' .. tostring(code))
    end
    if mode == 'r' then
      out[i + 2] = cc_drop(KEYS[i], call_id)
    else
      out[i + 2] = cc_extend(KEYS[i], call_id, cost)
    end
  end
  return out
end
