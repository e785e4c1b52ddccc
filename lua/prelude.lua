-- Shared helpers, placed first in the composed script.

-- An integer as a decimal string. Lua's own number-to-string conversion keeps
-- only 14 significant digits, which would round microsecond timestamps.
local function int(x)
  return string.format('%d', x)
end
