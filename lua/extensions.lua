-- After replay.lua, before check.lua: overrides and blocks, for the rules
-- of this call that have them. Reads `ext_spec` (args.lua: nil unless the
-- call sent one), `mode`, `now`, `cost`, and leaves `ext`, nil or a list of
-- records, and `ext_apply(out, all_pass)` for check.lua. A call without
-- the extra argument makes nothing here: rules without overrides or blocks
-- pay one comparison.
--
-- The extra argument, ARGV[3n+5], is one record per rule that has either,
-- separated by ";":
--   "<i>,<override key index>,<block key index>,<block_us>,<factor>,<max_us>,<period_us>"
-- i is the rule's position (1..n); the key indices point into KEYS after
-- the n rule keys (0: the rule has none); the last four are 0 for a rule
-- without a block.
--
-- Override: the key holds a limit (an integer). It replaces the rule's
-- limit (ARGV[3i+3]); for a token bucket it replaces the capacity and
-- scales the refill rate by the same factor (rate * override / capacity), so
-- the bucket refills in the same time. A cost above the limit that applies
-- (the override's, else the rule's) is an error reply, before anything is
-- written: for a rule that takes overrides the client cannot check it.
--
-- Block: the key holds "<until_us>:<duration_us>:<record_end_us>". While
-- now < until, the rule denies, with remaining 0 and retry_after and
-- reset_after to `until`. When the rule denies otherwise (and the call is
-- not a peek), it blocks the key from now: for `block_us`, or, while the
-- previous record still holds (now < record_end), for the previous duration
-- times `factor`, at most `max_us`; the record then holds until the block's
-- end plus `period_us`. That write is the one a denied check makes.
--
-- ext_apply appends two values per record to the reply, after the rules'
-- four: the limit an override set (0 when none) and 1 when the rule's
-- answer is a block.

local ext, ext_apply
if ext_spec then
  ext = {}
  for record in string.gmatch(ext_spec, '[^;]+') do
    local f = {}
    for v in string.gmatch(record, '[^,]+') do
      f[#f + 1] = v
    end
    local r = {
      i = tonumber(f[1]), okey = tonumber(f[2]), bkey = tonumber(f[3]), block = tonumber(f[4]),
      factor = tonumber(f[5]), max = tonumber(f[6]), period = tonumber(f[7]), limit = 0,
    }
    local i = r.i
    if r.okey > 0 then
      local v = redis.call('GET', KEYS[r.okey])
      local limit = tonumber(v or ARGV[3 * i + 3])
      if mode ~= 'u' and (costs and costs[i] or cost) > limit then
        return redis.error_reply('ERR throttlegate: cost above override ' .. i .. ' ' .. string.format('%d', limit))
      end
      if v then
        local code = ARGV[3 * i + 2]
        if code == 'b' or code == 'B' then
          ARGV[3 * i + 4] = tonumber(ARGV[3 * i + 4]) * limit / tonumber(ARGV[3 * i + 3])
        end
        ARGV[3 * i + 3] = limit
        r.limit = limit
      end
    end
    if r.bkey > 0 then
      local v = redis.call('GET', KEYS[r.bkey])
      if v then
        local u, d, e = string.match(v, '^(%d+):(%d+):(%d+)$')
        u, d, e = tonumber(u), tonumber(d), tonumber(e)
        if e > now then
          r.previous = d
        end
        if u > now then
          r.until_us = u
        end
      end
    end
    ext[#ext + 1] = r
  end

  -- Apply the blocks to the decided rules (out as check.lua built it);
  -- returns whether every non-shadow rule still admits.
  ext_apply = function(out, all_pass)
    for _, r in ipairs(ext) do
      local i = r.i
      local blocked = 0
      if r.until_us then
        out[4 * i - 1] = 0
        out[4 * i] = 0
        out[4 * i + 1] = r.until_us - now
        out[4 * i + 2] = r.until_us - now
        blocked = 1
      elseif r.block > 0 and out[4 * i - 1] == 0 and mode ~= 'p' then
        local d = r.block
        if r.previous then
          d = math.min(math.floor(r.previous * r.factor), r.max)
        end
        local u = now + d
        redis.call('SET', KEYS[r.bkey], string.format('%d:%d:%d', u, d, u + r.period), 'PX',
          math.ceil((d + r.period) / 1000))
        out[4 * i] = 0
        out[4 * i + 1] = math.max(out[4 * i + 1], d)
        out[4 * i + 2] = math.max(out[4 * i + 2], d)
        blocked = 1
      end
      if blocked == 1 and ARGV[3 * i + 2] >= 'a' then
        all_pass = false
      end
      out[#out + 1] = r.limit
      out[#out + 1] = blocked
    end
    return all_pass
  end
end
