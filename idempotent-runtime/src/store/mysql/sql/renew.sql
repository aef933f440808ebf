-- Extends the lease, and keeps the record at least a TTL from now.
-- ? lease, ? TTL (microseconds; MySQL placeholders are positional), ? scope_key_sha256,
-- ? scope, ? key, ? token.
UPDATE idempotency_records
SET lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
    expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
WHERE scope_key_sha256 = ? AND scope = ? AND `key` = ? AND token = ?
  AND state = 'in_progress'
