-- A claim of a key `claim_read.sql` found no record of: inserts the in-progress record,
-- or does nothing when a racing claim created one since (then the claim runs again).
-- ?1 scope, ?2 key, ?3 fingerprint, ?4 fingerprint version, ?5 token,
-- ?6 lease expires at, ?7 now, ?8 expires at (milliseconds from the store's clock).
INSERT INTO idempotency_records
    (scope, key, fingerprint, fingerprint_version, state, token, lease_expires_at,
     status, headers, body, created_at, expires_at)
VALUES (?1, ?2, ?3, ?4, 'in_progress', ?5, ?6, NULL, NULL, NULL, ?7, ?8)
ON CONFLICT (scope, key) DO NOTHING
