-- complete. KEYS[1] the record. ARGV: [1] clock offset ms, [2] token, [3] status,
-- [4] encoded headers, [5] '1' when a body follows, [6] the body.
-- Returns 1 when the token owned the in-progress record and it is completed now, else 0.
local key = KEYS[1]
local record, err = owned(key, ARGV[2], now_ms())
if err then
  return redis.error_reply(err)
end
if not record then
  return 0
end
redis.call('HSET', key, 'state', 'completed', 'status', ARGV[3], 'headers', ARGV[4])
-- The response replaces the steps: a completed record replays, it never resumes.
redis.call('HDEL', key, 'steps')
if ARGV[5] == '1' then
  redis.call('HSET', key, 'body', ARGV[6])
else
  -- No field at all means "body over the cap"; an empty field is an empty body.
  redis.call('HDEL', key, 'body')
end
-- A completed record lives exactly until its TTL; the lease no longer holds it.
redis.call('PEXPIREAT', key, ms(record.expires_at))
return 1
