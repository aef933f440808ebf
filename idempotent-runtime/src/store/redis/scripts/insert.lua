-- insert. KEYS[1] the record. ARGV: [1] version, then the claim (see `claim`).
-- Returns {1, now} when it inserted, else {0, now, the record's fields}.
local key = KEYS[1]
local now = now_ms()
local record = dump(key)
if record then
  return answer(0, now, record)
end
claim(key, now, ARGV[1], 2, false)
return answer(1, now)
