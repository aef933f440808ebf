-- Takes over a record whose TTL ran out and under which nothing runs (completed, or its
-- lease ran out too): Takeover::Expired. An UPDATE reads the newest committed version of
-- the row under its exclusive lock, so a record that changed since `claim_batch.sql` read
-- it is left alone (no row matched: the claim runs again). A new record lifetime: the
-- old one's steps go (store::steps_survive).
-- ? fingerprint, ? fingerprint version, ? token, ? lease, ? ttl (microseconds),
-- ? scope_key_sha256, ? scope, ? key.
UPDATE idempotency_records
SET fingerprint = ?, fingerprint_version = ?, state = 'in_progress', token = ?,
    lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
    status = NULL, headers = NULL, body = NULL, steps = NULL,
    created_at = UTC_TIMESTAMP(6), expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE scope_key_sha256 = ? AND scope = ? AND `key` = ?
  AND expires_at <= UTC_TIMESTAMP(6)
  AND (state = 'completed' OR lease_expires_at <= UTC_TIMESTAMP(6))
