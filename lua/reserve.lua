-- Ninth in the script, before the driver: reservations (a rule's `reserve`,
-- docs/concepts/reserve.md). Reads `mode`, `now`, `n` and `reserve_spec`
-- (args.lua: nil unless the call sent the reservation argument), and makes
-- nothing when it is absent. Only period counters (codes "f" and "q") are
-- reserved: the core sends no reservation for any other rule.
--
-- Mode "r": a check (exactly as "c") that also reserves. `reserve_spec` is
-- one number per rule, comma-separated: the units it asks for beyond the
-- cost (0 for a rule not reserved). When the request goes through, each such
-- rule takes min(ask, floor(remaining / 2)) more units (its remaining after
-- the cost): never more than the limit, and never more than half of what
-- is left, so a reservation shrinks as the period fills and the last units
-- are decided one request at a time. The units are counted in the period
-- decided in, like the cost (pc_commit), and the rule's remaining drops by
-- them: it is the backend's count, outstanding reservations included. The
-- reply gets one value per rule after everything else: the units granted.
-- A rule may send "<ask>:<units>:<period end>" instead: the leftover of its
-- reservation, given back (as in mode "g") before any rule is decided.
--
-- Mode "g": give reserved units back. `reserve_spec` is one
-- "<units>:<period end>" per rule; each key's count drops by at most
-- `units`, and only while the stored period is the one reserved from (its
-- end is the same) and still runs: units of a period that ended are not
-- returned (nothing counts them any more). A count that reaches 0 deletes
-- the key, as a give-back does. Returns { now, 0, then per rule the units
-- given back }.

local reserve_grant
if reserve_spec then
  local asks = {}
  for a in string.gmatch(reserve_spec, '[^,]+') do
    asks[#asks + 1] = a
  end

  -- Give `units` of KEYS[i] back while its stored period is the one ending
  -- at `end_s` and still runs; returns the units given back.
  local function give(i, units, end_s)
    local stored = redis.call('GET', KEYS[i])
    if not stored then
      return 0
    end
    local e, c, rest = string.match(stored, '^(%d+):(%d+)(.*)$')
    if e ~= end_s or tonumber(e) <= now then
      return 0
    end
    local count = tonumber(c)
    local given = math.min(units, count)
    if count - given <= 0 then
      redis.call('DEL', KEYS[i])
    else
      redis.call('SET', KEYS[i], string.format('%s:%d%s', e, count - given, rest), 'KEEPTTL')
    end
    return given
  end

  if mode == 'g' then
    local out = { now, 0 }
    for i = 1, n do
      local units_s, end_s = string.match(asks[i] or '', '^(%d+):(%d+)$')
      local given = 0
      local code = ARGV[3 * i + 2]
      if units_s and (code == 'f' or code == 'q') then
        given = give(i, tonumber(units_s), end_s)
      end
      out[i + 2] = given
    end
    return out
  end

  -- Mode "r": a rule whose reservation could not pay this request sends
  -- its leftover as "<ask>:<units>:<period end>"; it is given back before
  -- anything is decided, so the check sees what the direct path would.
  for i = 1, n do
    local ask_s, units_s, end_s = string.match(asks[i] or '', '^(%d+):(%d+):(%d+)$')
    local code = ARGV[3 * i + 2]
    if ask_s then
      asks[i] = ask_s
      if code == 'f' or code == 'q' then
        give(i, tonumber(units_s), end_s)
      end
    end
  end

  -- The units each rule takes beyond the cost (rule i at [i]), taken off
  -- its remaining in `out`; called by check.lua when the request goes through.
  reserve_grant = function(out)
    local granted = {}
    for i = 1, n do
      local ask = tonumber(asks[i]) or 0
      local code = ARGV[3 * i + 2]
      local g = 0
      if ask > 0 and out[4 * i - 1] == 1 and (code == 'f' or code == 'q') then
        g = math.min(ask, math.floor(out[4 * i] / 2))
        out[4 * i] = out[4 * i] - g
      end
      granted[i] = g
    end
    return granted
  end
end
