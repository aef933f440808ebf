-- Takes over an in-progress record within its TTL whose lease ran out, for a retry with
-- the same fingerprint: Takeover::LeaseLost. Same guarantees as take_over_expired.sql.
-- ? token, ? lease, ? ttl (microseconds), ? scope_key_sha256, ? scope, ? key,
-- ? fingerprint, ? fingerprint version.
UPDATE idempotency_records
SET token = ?, lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
    created_at = UTC_TIMESTAMP(6), expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE scope_key_sha256 = ? AND scope = ? AND `key` = ?
  AND state = 'in_progress'
  AND lease_expires_at <= UTC_TIMESTAMP(6)
  AND expires_at > UTC_TIMESTAMP(6)
  AND fingerprint = ? AND fingerprint_version = ?
