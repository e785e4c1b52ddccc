-- First in the script: a check that carries its deadline. The client gives
-- up on a call at its timeout and answers without it (degraded), so a script
-- that starts after that moment must change nothing, or a call the caller
-- saw fail would still count. The core puts two arguments before a check's
-- own (every mode but the peek "p", the give-back "u" and the settle "x"):
--
-- ARGV = { "!", deadline_us, <the call's own arguments> }
--   deadline_us: the last moment, on the server's clock (TIME, in
--   microseconds), at which the call may still run.
--
-- Past the deadline it returns { server time, -1 } and writes nothing. Else
-- it drops its two arguments and the call runs exactly as one sent without
-- them, and leaves the time it read in `server_now` (nil without a
-- deadline) for the files after it, which take it as the call's `now` on the
-- server's clock instead of reading TIME again.
local server_now
if ARGV[1] == '!' then
  local t = redis.call('TIME')
  server_now = t[1] * 1000000 + t[2]
  -- (TIME's strings and the deadline read as numbers by arithmetic: one
  -- conversion each, where tonumber makes two.)
  if server_now > ARGV[2] + 0 then
    return { server_now, -1 }
  end
  table.remove(ARGV, 1)
  table.remove(ARGV, 1)
end
