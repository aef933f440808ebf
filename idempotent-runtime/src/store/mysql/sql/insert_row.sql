-- One claim's row in insert_batch.sql's insert, every value a literal (group_commit::inline).
-- ? scope_key_sha256, ? scope, ? key, ? fingerprint, ? fingerprint version, ? token,
-- ? version, ? lease (microseconds), ? ttl (microseconds).
(?, ?, ?, ?, ?, 'in_progress', ?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, NULL, NULL,
 NULL, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
