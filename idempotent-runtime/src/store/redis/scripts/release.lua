-- release. KEYS[1] the record. ARGV: [1] clock offset ms, [2] token, [3] the token a
-- released record holds (FencingToken::RELEASED).
-- Returns 1 when the token owned the in-progress record, else 0. The record is deleted,
-- unless it holds steps: then it stays in progress with its lease ended now and its token
-- RELEASED (release_keeps_record), so the released owner is fenced off as after a delete
-- and the same request's next claim takes it over and resumes.
local key = KEYS[1]
local now = now_ms()
local record, err = owned(key, ARGV[2], now)
if err then
  return redis.error_reply(err)
end
if not record then
  return 0
end
if redis.call('HSTRLEN', key, 'steps') > 0 then
  redis.call('HSET', key, 'lease_expires_at', ms(now), 'token', ARGV[3])
  -- Live until its TTL now that no lease holds it (gone at once if the TTL already ran out).
  redis.call('PEXPIREAT', key, ms(math.max(record.expires_at, now)))
  return 1
end
redis.call('DEL', key)
return 1
