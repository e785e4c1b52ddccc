-- Sixth in the script. One counter per period: fixed windows ("f", `window`
-- microseconds, aligned to the Unix epoch) and calendar quotas ("q", an hour,
-- day, week or month of the calendar read at a fixed offset from UTC). Reads
-- `uses_period` and `floor_div` (args.lua) and defines locals made only when
-- a rule of this call is one (nil otherwise): fw_end(now, window) and
-- q_end(now, spec), for pc_end, and, for check.lua, pc_end(code, now, param)
-- -> the end of the period holding `now`, pc_decide(key, now, cost, limit,
-- period_end) and pc_commit(key, now, cost, end_us, call_id, stored).
--
-- The state is a string "<period end in microseconds>:<units>", followed,
-- once a call asked for deduplication (mode "C"), by ":" and the ids of the
-- last 64 such admissions of that period (comma-separated, newest last). The
-- stored count holds while its period runs (end > now); a stored period that
-- ends later than the current one (a clock that stepped back) stays the
-- period, so a clock that steps back cannot open a period twice. Only an
-- admission writes; the key expires when its period ends. Numbers are
-- written with string.format('%d'): Lua's own conversion keeps only 14
-- significant digits.
--
-- Periods: a fixed window ends at (floor(now / window) + 1) * window. A
-- quota's calendar is UTC shifted by the offset: an hour or a day ends at the
-- next whole one of local time, a week on the next Monday 00:00 (1970-01-05
-- was a Monday), a month on the first of the next month 00:00 (proleptic
-- Gregorian calendar, H. Hinnant's days_from_civil / civil_from_days).

local fw_end, q_end, pc_end, pc_decide, pc_commit
if uses_period then
  fw_end = function(now, window)
    return (floor_div(now, window) + 1) * window
  end

  q_end = function(now, spec)
    local unit, offset_s = string.match(spec, '^(%a):(-?%d+)$')
    local offset = tonumber(offset_s) * 1000000
    local t = now + offset
    local hour, day = 3600000000, 86400000000
    if unit == 'h' then
      return (floor_div(t, hour) + 1) * hour - offset
    end
    local days = floor_div(t, day)
    if unit == 'd' then
      return (days + 1) * day - offset
    end
    if unit == 'w' then
      return ((floor_div(days + 3, 7) + 1) * 7 - 3) * day - offset
    end
    -- A month: the civil date of `days`, then the first day of the next month.
    local z = days + 719468
    local era = floor_div(z, 146097)
    local doe = z - era * 146097
    local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
    local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
    local mp = math.floor((5 * doy + 2) / 153)
    local m = mp < 10 and mp + 3 or mp - 9
    local y = yoe + era * 400
    if m <= 2 then
      y = y + 1
    end
    if m == 12 then
      y, m = y + 1, 1
    else
      m = m + 1
    end
    -- days_from_civil(y, m, 1)
    if m <= 2 then
      y = y - 1
    end
    era = floor_div(y, 400)
    yoe = y - era * 400
    mp = m > 2 and m - 3 or m + 9
    doy = math.floor((153 * mp + 2) / 5)
    doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
    return (era * 146097 + doe - 719468) * day - offset
  end

  -- The end of the period holding `now` for a rule with this code and third argument.
  pc_end = function(code, now, param)
    if code == 'f' or code == 'F' then
      return fw_end(now, tonumber(param))
    end
    return q_end(now, param)
  end

  -- Decide one rule. Returns allowed (0/1), remaining, retry_after,
  -- reset_after, the end of the period decided in, and the stored state as
  -- read when it still holds (false otherwise), for pc_commit.
  pc_decide = function(key, now, cost, limit, period_end)
    local count, end_us, live = 0, period_end, false
    local stored = redis.call('GET', key)
    if stored then
      local e, c = string.match(stored, '^(%d+):(%d+)')
      e = tonumber(e)
      if e > now then
        count = tonumber(c)
        live = stored
        if e > end_us then
          end_us = e
        end
      end
    end
    if count + cost <= limit then
      local reset_after = 0
      if count + cost > 0 then
        reset_after = end_us - now
      end
      return 1, limit - count - cost, 0, reset_after, end_us, live
    end
    -- Denied: nothing but the end of the period frees units.
    return 0, limit - count, end_us - now, end_us - now, end_us, live
  end

  -- Store the counter after an admission: `cost` more units in the period
  -- ending at `end_us`. The ids of earlier calls of the same period
  -- (`stored`, the state as decided, false when it no longer held) are kept;
  -- a call id joins them, and the oldest drops out after 64.
  pc_commit = function(key, now, cost, end_us, call_id, stored)
    local count, kept = 0, ''
    if stored then
      local c, rest = string.match(stored, '^%d+:(%d+):?(.*)$')
      count = tonumber(c)
      kept = rest
    end
    local value = string.format('%d:%d', end_us, count + cost)
    if call_id or kept ~= '' then
      local list = ids_push(kept, call_id)
      if list then
        value = value .. ':' .. list
      end
    end
    redis.call('SET', key, value, 'PX', math.max(1, math.ceil((end_us - now) / 1000)))
  end
end
