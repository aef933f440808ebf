-- A claim of a key with no record: inserts the in-progress record, or fails with a
-- duplicate-key error when a record exists (then `claim_read.sql` says why, and a
-- takeover statement may follow). Plain INSERT, not INSERT IGNORE: IGNORE would also
-- turn real errors (data too long, …) into warnings.
-- ? scope_key_sha256, ? scope, ? key, ? fingerprint, ? fingerprint version, ? token,
-- ? lease (microseconds), ? ttl (microseconds); every time is the database's.
INSERT INTO idempotency_records
    (scope_key_sha256, scope, `key`, fingerprint, fingerprint_version, state, token,
     lease_expires_at, status, headers, body, created_at, expires_at)
VALUES (?, ?, ?, ?, ?, 'in_progress', ?,
        UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, NULL, NULL, NULL,
        UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
