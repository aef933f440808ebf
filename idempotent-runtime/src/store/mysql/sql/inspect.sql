-- The record as an operator sees it, judged at this statement's UTC_TIMESTAMP(6):
-- `inspect`, and the read `forget` decides on. A consistent (non-locking) read. Times as
-- microseconds since the epoch (the columns hold UTC). The steps of an in-progress
-- record (a completed one's response replaced them).
-- ? scope_key_sha256, ? scope, ? key.
SELECT state, token, fingerprint,
       CAST(fingerprint_version AS SIGNED) AS fingerprint_version,
       CAST(status AS SIGNED) AS status,
       TIMESTAMPDIFF(MICROSECOND, TIMESTAMP('1970-01-01'), created_at) AS created_at_us,
       TIMESTAMPDIFF(MICROSECOND, TIMESTAMP('1970-01-01'), expires_at) AS expires_at_us,
       TIMESTAMPDIFF(MICROSECOND, TIMESTAMP('1970-01-01'), lease_expires_at)
           AS lease_expires_at_us,
       (expires_at > UTC_TIMESTAMP(6)
        OR (state = 'in_progress' AND lease_expires_at > UTC_TIMESTAMP(6))) AS live,
       IF(state = 'in_progress', lease_expires_at > UTC_TIMESTAMP(6), NULL) AS lease_alive,
       IF(state = 'in_progress',
          CAST(CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_expires_at) / 1000)
               AS SIGNED),
          NULL) AS lease_left_ms,
       IF(state = 'in_progress', steps, NULL) AS steps
FROM idempotency_records
WHERE scope_key_sha256 = ? AND scope = ? AND `key` = ?
