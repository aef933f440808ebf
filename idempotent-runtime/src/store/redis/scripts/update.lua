-- update. KEYS[1] the record. ARGV: [1] the version it must be at, [2] its next version,
-- [3] the change, then the change's arguments:
--   claim: the claim (see `claim`), then '1' to keep the steps
--   renew: lease ms, ttl ms
--   step: the encoded step
--   complete: status, encoded headers, '1' when a body follows, the body
--   end_lease: the token a released record holds
-- Applies the change as Record::changed defines it; a change of an in-progress record
-- changes only the version of a completed one.
-- Returns {1, now} when applied, else {0, now[, the record's fields]} (stale).
local key = KEYS[1]
local now = now_ms()
local record = dump(key)
if not record or record[12] ~= ARGV[1] then
  return answer(0, now, record)
end
local change = ARGV[3]
local known = { claim = true, renew = true, step = true, complete = true, end_lease = true }
if not known[change] then
  return redis.error_reply('ERR unknown change ' .. change)
end
local in_progress = record[1] == 'in_progress'
if change == 'claim' then
  claim(key, now, ARGV[2], 4, in_progress and ARGV[9] == '1')
  return answer(1, now)
end
redis.call('HSET', key, 'version', ARGV[2])
if change == 'complete' then
  redis.call('HSET', key, 'state', 'completed', 'status', ARGV[4], 'headers', ARGV[5])
  redis.call('HDEL', key, 'steps')
  if ARGV[6] == '1' then
    redis.call('HSET', key, 'body', ARGV[7])
  else
    -- No field at all is a body over the cap; an empty field an empty body.
    redis.call('HDEL', key, 'body')
  end
elseif in_progress and change == 'renew' then
  local lease_expires_at = now + tonumber(ARGV[4])
  local expires_at = math.max(tonumber(record[6]), now + tonumber(ARGV[5]))
  redis.call('HSET', key, 'lease_expires_at', ms(lease_expires_at), 'expires_at', ms(expires_at))
  redis.call('PEXPIREAT', key, ms(math.max(expires_at, lease_expires_at)))
elseif in_progress and change == 'step' then
  -- Hashes have no APPEND; Lua strings are byte strings, so concatenation is exact.
  redis.call('HSET', key, 'steps', (record[8] or '') .. ARGV[4])
elseif in_progress and change == 'end_lease' then
  -- Redis's expiry stays where the lease had put it: never earlier than the engine needs.
  redis.call('HSET', key, 'lease_expires_at', ms(now), 'token', ARGV[4])
end
return answer(1, now)
