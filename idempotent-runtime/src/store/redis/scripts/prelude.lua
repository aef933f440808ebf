-- Prepended to every script of the Redis store (see scripts.rs).
--
-- One clock: the Redis server's. TIME inside a script is allowed because scripts are
-- replicated by their effects (the default since Redis 5, the only mode since 7): replicas
-- and the AOF receive the HSET/PEXPIREAT the script made, never the script itself.
-- ARGV[1] is the store's clock offset in milliseconds (0 except in tests).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
end

-- Milliseconds as an integer string: Lua numbers are doubles, and Redis would format a
-- large one in exponent notation.
local function ms(n)
  return string.format('%.0f', n)
end

-- The record at `key`, or nil when there is none; a second result is the error to
-- return (`return redis.error_reply(err)`) when the record cannot be read.
local function load(key)
  local r = redis.call('HMGET', key, 'state', 'fp', 'fpv', 'token', 'lease_expires_at', 'expires_at')
  if not r[1] then
    return nil
  end
  local record = {
    state = r[1], fp = r[2], fpv = r[3], token = r[4],
    lease_expires_at = tonumber(r[5]), expires_at = tonumber(r[6]),
  }
  if (record.state ~= 'in_progress' and record.state ~= 'completed')
      or not record.lease_expires_at or not record.expires_at then
    return nil, 'CORRUPT idempotency record ' .. key .. ' has no valid state or times'
  end
  return record, nil
end

-- Live: within its TTL, or an in-progress claim whose lease is still held. A record that
-- is not live is gone, whatever Redis's own expiry has done with it yet.
local function is_live(record, now)
  return record.expires_at > now
    or (record.state == 'in_progress' and record.lease_expires_at > now)
end

-- The in-progress record `token` owns, or nil (fencing for renew, complete, release and
-- record_step); a second result as for load.
local function owned(key, token, now)
  local record, err = load(key)
  if record and record.state == 'in_progress' and record.token == token
      and is_live(record, now) then
    return record, nil
  end
  return nil, err
end

-- What an operator sees of a live record (inspect, forget): {state, fingerprint digest,
-- fingerprint version, created_at, expires_at, lease_expires_at, lease held (1/0),
-- status, steps}. A field the record lacks is nil (Lua `false`, so the array stays
-- whole); steps are an in-progress record's only (a completed one's response replaced
-- them).
local function describe(key, record, now)
  local r = redis.call('HMGET', key, 'created_at', 'status', 'steps')
  local held = 0
  local steps = false
  if record.state == 'in_progress' then
    steps = r[3] or false
    if record.lease_expires_at > now then
      held = 1
    end
  end
  return { record.state, record.fp, record.fpv, r[1] or false, ms(record.expires_at),
    ms(record.lease_expires_at), held, r[2] or false, steps }
end
