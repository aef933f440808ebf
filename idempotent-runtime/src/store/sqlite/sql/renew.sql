-- ?1 scope, ?2 key, ?3 token, ?4 new lease end: also keeps the record at least that long.
UPDATE idempotency_records
SET lease_expires_at = ?4, expires_at = MAX(expires_at, ?4)
WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = 'in_progress'
