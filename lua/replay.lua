-- Fifth in the script. Re-sent calls and give-backs, for both algorithms.
-- Reads `mode` (args.lua) and defines three locals, made only for the modes
-- that need them ("C" and "u"; nil otherwise): ids_of(stored), for the two
-- others, and, for check.lua, seen(code, key, call_id) in mode "C" and
-- give_back(code, key, cost, capacity, call_id) in mode "u". `code` is a
-- rule's algorithm code ("w"/"W" sliding-window log, "b"/"B" token bucket).

local ids_of, seen, give_back
if mode == 'u' or mode == 'C' then
  -- The call ids recorded in a stored bucket ("" when none).
  ids_of = function(stored)
    return string.match(stored, '^%d+:%d+:(.*)$') or ''
  end

  -- True when the call `call_id` was already recorded under `key` (a re-sent
  -- call that Redis had executed): a member of a log, or one of the last 64
  -- admissions recorded in a bucket.
  seen = function(code, key, call_id)
    if code == 'w' or code == 'W' then
      return redis.call('ZSCORE', key, call_id) ~= false
    end
    local stored = redis.call('GET', key)
    if not stored then
      return false
    end
    for id in string.gmatch(ids_of(stored), '[^,]+') do
      if id == call_id then
        return true
      end
    end
    return false
  end

  -- Give back what the check `call_id` recorded under `key` (Redis Cluster:
  -- another slot of the same check denied it). `capacity` is a bucket's. A
  -- bucket's id leaves its list as the tokens come back, so a re-sent
  -- give-back cannot refund twice; a call whose id has already dropped out of
  -- the list is not refunded (a brief over-restriction, never an over-admission).
  give_back = function(code, key, cost, capacity, call_id)
    if code == 'w' or code == 'W' then
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
      return
    end
    local stored = redis.call('GET', key)
    if not stored then
      return
    end
    local t, ts = string.match(stored, '^(%d+):(%d+)')
    local kept = {}
    local found = false
    for id in string.gmatch(ids_of(stored), '[^,]+') do
      if id == call_id and not found then
        found = true
      else
        kept[#kept + 1] = id
      end
    end
    if not found then
      return
    end
    local tokens = math.min(capacity * 1000000, tonumber(t) + cost * 1000000)
    local value = string.format('%d:%s', tokens, ts)
    if #kept > 0 then
      value = value .. ':' .. table.concat(kept, ',')
    end
    redis.call('SET', key, value, 'KEEPTTL')
  end
end
