-- try_claim. KEYS[1] the record. ARGV: [1] clock offset ms, [2] fingerprint digest,
-- [3] fingerprint version, [4] token, [5] ttl ms, [6] lease ms.
--
-- Returns {'claimed', takeover[, steps]} (takeover: '' for a new key, 'expired' or
--         'lease_lost'; steps: the record's encoded steps, kept by a 'lease_lost' takeover)
--       | {'replay', status, headers, body or nil, ms until the record expires}
--       | {'in_progress', lease ms left} | {'mismatch'}.
local key = KEYS[1]
local now = now_ms()
local record, err = load(key)
if err then
  return redis.error_reply(err)
end
-- Why a record that is there gets replaced (the takeover rule of every store).
local takeover = ''
-- The steps the record keeps across this claim: only a lost lease's (steps_survive).
local steps = false
if record then
  takeover = 'expired'
end
if record and is_live(record, now) then
  if record.fp ~= ARGV[2] or record.fpv ~= ARGV[3] then
    return { 'mismatch' }
  end
  if record.state == 'completed' then
    local r = redis.call('HMGET', key, 'status', 'headers', 'body')
    return { 'replay', r[1], r[2], r[3], record.expires_at - now }
  end
  if record.lease_expires_at > now then
    return { 'in_progress', record.lease_expires_at - now }
  end
  -- In progress, lease ran out, same fingerprint: the owner crashed; take it over.
  takeover = 'lease_lost'
  steps = redis.call('HGET', key, 'steps')
end
-- New key, expired record, or takeover: write a fresh record over whatever was there.
local expires_at = now + tonumber(ARGV[5])
local lease_expires_at = now + tonumber(ARGV[6])
redis.call('DEL', key)
redis.call('HSET', key,
  'state', 'in_progress', 'fp', ARGV[2], 'fpv', ARGV[3], 'token', ARGV[4],
  'lease_expires_at', ms(lease_expires_at), 'expires_at', ms(expires_at),
  'created_at', ms(now))
if steps then
  redis.call('HSET', key, 'steps', steps)
end
-- Redis removes the record when neither its TTL nor its lease holds it any more.
redis.call('PEXPIREAT', key, ms(math.max(expires_at, lease_expires_at)))
if steps then
  return { 'claimed', takeover, steps }
end
return { 'claimed', takeover }
