-- record_step. KEYS[1] the record. ARGV: [1] clock offset ms, [2] token, [3] the step,
-- encoded (encode_step). Returns 1 when the token owned the in-progress record and the
-- step is appended to its `steps` field, else 0 (nothing changed).
local key = KEYS[1]
local record, err = owned(key, ARGV[2], now_ms())
if err then
  return redis.error_reply(err)
end
if not record then
  return 0
end
-- Hashes have no APPEND; Lua strings are byte strings, so concatenation is exact.
local steps = redis.call('HGET', key, 'steps') or ''
redis.call('HSET', key, 'steps', steps .. ARGV[3])
return 1
