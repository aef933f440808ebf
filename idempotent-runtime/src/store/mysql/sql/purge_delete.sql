-- Deletes the records `purge_find.sql` found, re-checking expiry on each locked row (a
-- record claimed again meanwhile stays). {ids} is one `?` per scope_key_sha256.
DELETE FROM idempotency_records
WHERE scope_key_sha256 IN ({ids})
  AND expires_at <= UTC_TIMESTAMP(6)
  AND (state = 'completed' OR lease_expires_at <= UTC_TIMESTAMP(6))
