-- Why record_step.sql matched no row, read only then: a row here means the token still
-- holds the record and the step did not fit (no row: the token owns nothing).
-- ? scope_key_sha256, ? scope, ? key, ? token.
SELECT CAST(COALESCE(LENGTH(steps), 0) AS SIGNED) AS steps_bytes,
       CAST(@@max_allowed_packet AS SIGNED) AS max_allowed_packet
FROM idempotency_records
WHERE scope_key_sha256 = ? AND scope = ? AND `key` = ? AND token = ?
  AND state = 'in_progress'
