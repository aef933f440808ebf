-- ?1 scope, ?2 key, ?3 token, ?4 status, ?5 headers, ?6 body (NULL: over the cap). The
-- response replaces the recorded steps.
UPDATE idempotency_records
SET state = 'completed', lease_expires_at = NULL, lease_boot_id = NULL,
    lease_ends_boot_ms = NULL, status = ?4, headers = ?5, body = ?6, steps = NULL
WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = 'in_progress'
