-- ?1 scope, ?2 key, ?3 token, ?4 new lease end on the wall clock; ?5 boot id (NULL: the
-- lease is on the wall clock), ?6 new lease end on the boot's clock; ?7 a TTL from now on
-- the wall clock: the record lives at least that long.
UPDATE idempotency_records
SET lease_expires_at = ?4, expires_at = MAX(expires_at, ?7),
    lease_boot_id = ?5, lease_ends_boot_ms = ?6
WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = 'in_progress'
