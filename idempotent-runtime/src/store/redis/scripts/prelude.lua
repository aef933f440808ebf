-- Prepended to every script of the Redis store (see scripts.rs). The scripts store a
-- record, compare its version and answer it with the server's clock; every decision about
-- a record is the engine's (store::fenced::rules).
--
-- One clock: the Redis server's. TIME inside a script that writes is allowed because
-- scripts are replicated by their effects (the default since Redis 5, the only mode
-- since 7): replicas and the AOF receive the HSET/PEXPIREAT a script made, never the script.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Milliseconds as an integer string: Lua numbers are doubles, and Redis would format a
-- large one in exponent notation.
local function ms(n)
  return string.format('%.0f', n)
end

-- The record at `key` as its fields in this order (what records.rs decodes; a missing
-- field is `false`, so the array stays whole), or nil when there is none. The last one is
-- the version.
local FIELDS = { 'state', 'fp', 'fpv', 'token', 'lease_expires_at', 'expires_at',
  'created_at', 'steps', 'status', 'headers', 'body', 'version' }
local function dump(key)
  if redis.call('EXISTS', key) == 0 then
    return nil
  end
  local r = redis.call('HMGET', key, unpack(FIELDS))
  if not r[12] then
    -- Written by a release that kept no version: one derived from every field its
    -- scripts change, so that their writes still move it during a rolling upgrade. Its
    -- first 13 hex digits (52 bits) are exact in a Lua number.
    local basis = table.concat({ r[1] or '', r[4] or '', r[5] or '', r[6] or '',
      r[7] or '', #(r[8] or '') }, ':')
    r[12] = ms(tonumber(string.sub(redis.sha1hex(basis), 1, 13), 16))
  end
  return r
end

-- The answer of every script: an outcome, the server's now, and the record's fields
-- when there is one to answer.
local function answer(outcome, now, record)
  if record then
    return { outcome, now, unpack(record) }
  end
  return { outcome, now }
end

-- A claim (RecordStore::insert, Change::TakeOver): in progress under this fingerprint and token, created now,
-- at `version`; steps kept only when `keep_steps`, a response never. ARGV from `at`:
-- fingerprint digest, fingerprint version, token, ttl ms, lease ms.
local function claim(key, now, version, at, keep_steps)
  local expires_at = now + tonumber(ARGV[at + 3])
  local lease_expires_at = now + tonumber(ARGV[at + 4])
  redis.call('HDEL', key, 'status', 'headers', 'body')
  if not keep_steps then
    redis.call('HDEL', key, 'steps')
  end
  redis.call('HSET', key, 'state', 'in_progress', 'fp', ARGV[at], 'fpv', ARGV[at + 1],
    'token', ARGV[at + 2], 'lease_expires_at', ms(lease_expires_at),
    'expires_at', ms(expires_at), 'created_at', ms(now), 'version', version)
  -- Redis drops the record once neither of its times holds it.
  redis.call('PEXPIREAT', key, ms(math.max(expires_at, lease_expires_at)))
end
