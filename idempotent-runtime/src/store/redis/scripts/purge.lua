-- purge_expired, one candidate key. KEYS[1] a key under the store's prefix.
-- ARGV: [1] clock offset ms. Returns 1 when it deleted an expired record, else 0.
local key = KEYS[1]
if redis.call('TYPE', key).ok ~= 'hash' then
  return 0
end
local record, err = load(key)
if err then
  return redis.error_reply(err)
end
if not record or is_live(record, now_ms()) then
  return 0
end
redis.call('DEL', key)
return 1
