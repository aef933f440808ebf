-- Takes over a record whose TTL ran out and under which nothing runs (completed, or its
-- lease ran out too): Takeover::Expired. Same parameters as claim_new.sql. The condition
-- is checked on the row as it is now, so a record that changed since it was read is
-- left alone (no row affected: the claim runs again). A new record lifetime: the old one's
-- steps go (`steps_survive`).
UPDATE idempotency_records
SET fingerprint = ?3, fingerprint_version = ?4, state = 'in_progress', token = ?5,
    lease_expires_at = ?6, status = NULL, headers = NULL, body = NULL,
    created_at = ?7, expires_at = ?8, lease_boot_id = ?9, lease_ends_boot_ms = ?11,
    steps = NULL
WHERE scope = ?1 AND key = ?2
  AND expires_at <= ?7
  AND (state = 'completed' OR lease_left_ms(?7, ?9, ?10) <= 0)
