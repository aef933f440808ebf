-- renew. KEYS[1] the record. ARGV: [1] clock offset ms, [2] token, [3] lease ms,
-- [4] TTL ms.
-- Returns 1 when the token owns the in-progress record, else 0 (nothing changed).
local key = KEYS[1]
local now = now_ms()
local record, err = owned(key, ARGV[2], now)
if err then
  return redis.error_reply(err)
end
if not record then
  return 0
end
local lease_expires_at = now + tonumber(ARGV[3])
-- The record lives at least a TTL past its owner's last renewal.
local expires_at = math.max(record.expires_at, now + tonumber(ARGV[4]))
redis.call('HSET', key, 'lease_expires_at', ms(lease_expires_at), 'expires_at', ms(expires_at))
redis.call('PEXPIREAT', key, ms(expires_at))
return 1
