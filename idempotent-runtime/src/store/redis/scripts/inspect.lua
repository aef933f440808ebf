-- inspect. KEYS[1] the record. ARGV: [1] clock offset ms.
-- Returns nil when there is no live record, else describe(...) (see the prelude).
local key = KEYS[1]
local now = now_ms()
local record, err = load(key)
if err then
  return redis.error_reply(err)
end
if not record or not is_live(record, now) then
  return nil
end
return describe(key, record, now)
