-- Third in the script, reached by every mode but "s" and "f"
-- (single_rule.lua has returned for those, or rewritten ARGV into the
-- general form of the same check). Reads the arguments of the general form and leaves,
-- as locals for the files after it: mode, now, monotonic (true when now came
-- from TIME), call_id, cost, n (#KEYS), replayed (0; check.lua may set it),
-- uses_log / uses_bucket / uses_counters / uses_period / uses_lease (which algorithms
-- this call's rules use), floor_div(a, b) (made only when a sliding
-- window of counters or a period counter needs it; nil otherwise) and the
-- names ids_push / ids_take (assigned by replay.lua).
--
-- KEYS = the rules' keys, one per rule, in the order of their arguments
-- ARGV[1] mode: "c" check (consume on success); "C" the same, for a call
--         that may be a re-send of one Redis already executed, so its call
--         id is looked up first; "p" peek (never records); "u" undo: give
--         back what the check with this call id consumed (Redis Cluster,
--         when another slot of the same check denied it)
-- ARGV[2] now in microseconds (an integer, read with tonumber), or "" to
--         read the server clock with TIME
-- ARGV[3] call id (random per call, made by the client)
-- ARGV[4] cost (integer >= 1), or one cost per key, "<c1>,<c2>,...,", for a
--         check whose rules each take their own cost (a check over several
--         items); a rule of cost 0 is decided as a request of cost 1 would
--         be and records nothing: it reports what is left, and denies the
--         check when nothing is
-- then for each key, 3 values: an algorithm code and its two parameters,
--   "w", limit, window_us          sliding window log
--   "b", capacity, refill_rate     token bucket
--   "k", limit, "<window_us>:<precision_us>"   sliding window of counters
--   "f", limit, window_us          fixed window (epoch-aligned)
--   "q", limit, "<period>:<offset_s>"          calendar quota: period h, d,
--                                  w or m, offset in seconds east of UTC
--   "l", limit, lease_us           concurrency (lua/concurrency.lua)
-- with the code in upper case ("W", "B", "K", "F", "Q") for a shadow rule,
-- which reports but never denies.
--
-- Returns (from check.lua) { now, replayed (0/1), then per key: allowed
-- (0/1), remaining, retry_after_us, reset_after_us }; mode "u" returns
-- { now, 0 }. All values are integers. Rule i's arguments are
-- ARGV[3i+2 .. 3i+4]; its results are out[4i-1 .. 4i+2].

local mode = ARGV[1]
local now
-- The server's clock only moves forward (barring a wall-clock step on the
-- server), which spares a lookup per sliding-window admission.
local monotonic = ARGV[2] == ''
if monotonic then
  -- Read by deadline.lua already when the call has a deadline.
  now = server_now
  if not now then
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2]
  end
else
  now = tonumber(ARGV[2])
end
local call_id = ARGV[3]
local cost = tonumber(ARGV[4])
-- Per-rule costs: `costs[i]` is rule i's and `cost` the largest (nil
-- `costs` when every rule takes `cost`). Read as `costs and costs[i] or cost`.
local costs
if not cost and string.find(ARGV[4], ',', 1, true) then
  costs = {}
  cost = 0
  for c in string.gmatch(ARGV[4], '%d+') do
    local v = tonumber(c)
    costs[#costs + 1] = v
    if v > cost then
      cost = v
    end
  end
end
local n = #KEYS
local replayed = 0
-- Overrides and blocks (extensions.lua): a call whose rules have any sends
-- one more argument after the rules' triples, and the keys they read after
-- the rules' keys.
local ext_spec
-- Reservations (reserve.lua): modes "r" and "g" send two more arguments,
-- the extension argument ("" when none) and the reservation's.
local reserve_spec
local tail = (#ARGV - 4) % 3
if tail == 1 then
  ext_spec = ARGV[#ARGV]
  n = (#ARGV - 5) / 3
elseif tail == 2 then
  reserve_spec = ARGV[#ARGV]
  if ARGV[#ARGV - 1] ~= '' then
    ext_spec = ARGV[#ARGV - 1]
  end
  n = (#ARGV - 6) / 3
end

-- Which algorithms this call uses: the functions of the others are not even
-- made (each local function is a closure created afresh on every call of
-- the script, and this script runs on every request).
local uses_log, uses_bucket, uses_counters, uses_period, uses_lease = false, false, false, false, false
for i = 1, n do
  local code = ARGV[3 * i + 2]
  if code == 'w' or code == 'W' then
    uses_log = true
  elseif code == 'l' or code == 'L' then
    uses_lease = true
  elseif code == 'k' or code == 'K' then
    uses_counters = true
  elseif code == 'f' or code == 'F' or code == 'q' or code == 'Q' then
    uses_period = true
  else
    uses_bucket = true
  end
end

-- floor(a / b) for integers (b > 0), exact: the quotient of two doubles is
-- rounded, which can cross an integer when a is large, so it is corrected.
local floor_div
if uses_counters or uses_period then
  floor_div = function(a, b)
    local q = math.floor(a / b)
    if q * b > a then
      q = q - 1
    elseif (q + 1) * b <= a then
      q = q + 1
    end
    return q
  end
end


-- The lists of recent call ids that logs, buckets, sliding windows of
-- counters and period counters store are kept by one helper of replay.lua,
-- ids_push(list, entry, keep) and ids_take(list, entry): declared here so
-- that the algorithm files can call them, assigned there.
local ids_push, ids_take
