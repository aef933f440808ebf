-- The record that refused `claim_new.sql`, judged at this statement's UTC_TIMESTAMP(6)
-- as the takeover rule needs it; a consistent (non-locking) read: it writes and locks
-- nothing, so replays, 409s and 422s never queue on the row. The response columns only
-- for the same fingerprint (a mismatch does not ship the body).
-- ? fingerprint, ? fingerprint version, ? scope_key_sha256, ? scope, ? key.
SELECT r.state,
       r.expires_at <= UTC_TIMESTAMP(6) AS ttl_ran_out,
       r.lease_expires_at <= UTC_TIMESTAMP(6) AS lease_ran_out,
       (r.fingerprint = c.fingerprint AND r.fingerprint_version = c.version)
           AS same_fingerprint,
       CAST(CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), r.lease_expires_at) / 1000)
            AS SIGNED) AS lease_remaining_ms,
       CAST(FLOOR(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), r.expires_at) / 1000)
            AS SIGNED) AS ttl_remaining_ms,
       IF(r.fingerprint = c.fingerprint AND r.fingerprint_version = c.version,
          r.status, NULL) AS status,
       IF(r.fingerprint = c.fingerprint AND r.fingerprint_version = c.version,
          r.headers, NULL) AS headers,
       IF(r.fingerprint = c.fingerprint AND r.fingerprint_version = c.version,
          r.body, NULL) AS body
FROM (SELECT ? AS fingerprint, ? AS version) AS c, idempotency_records AS r
WHERE r.scope_key_sha256 = ? AND r.scope = ? AND r.`key` = ?
