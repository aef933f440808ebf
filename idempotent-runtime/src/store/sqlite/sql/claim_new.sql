-- A claim of a key `claim_read.sql` found no record of: inserts the in-progress record,
-- or does nothing when a racing claim created one since (then the claim runs again).
-- ?1 scope, ?2 key, ?3 fingerprint, ?4 fingerprint version, ?5 token,
-- ?6 lease expires at, ?7 now, ?8 expires at (milliseconds on the wall clock),
-- ?9 boot id (NULL: the lease is on the wall clock), ?10 now on the boot's clock,
-- ?11 lease ends on the boot's clock (see lease_time.rs).
INSERT INTO idempotency_records
    (scope, key, fingerprint, fingerprint_version, state, token, lease_expires_at,
     status, headers, body, created_at, expires_at, lease_boot_id, lease_ends_boot_ms)
VALUES (?1, ?2, ?3, ?4, 'in_progress', ?5, ?6, NULL, NULL, NULL, ?7, ?8, ?9, ?11)
ON CONFLICT (scope, key) DO NOTHING
