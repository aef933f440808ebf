-- release. KEYS[1] the record. ARGV: [1] clock offset ms, [2] token.
-- Returns 1 when the token owned the in-progress record and it is deleted now, else 0.
local key = KEYS[1]
local record, err = owned(key, ARGV[2], now_ms())
if err then
  return redis.error_reply(err)
end
if not record then
  return 0
end
redis.call('DEL', key)
return 1
