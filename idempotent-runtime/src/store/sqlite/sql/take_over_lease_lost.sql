-- Takes over an in-progress record within its TTL whose lease ran out, for a retry with
-- the same fingerprint: Takeover::LeaseLost. Same parameters and guarantees as
-- take_over_expired.sql. The steps stay (`steps_survive`) and are returned as this
-- statement leaves them: every step the old owner recorded before the takeover, none
-- after (its token no longer matches record_step.sql). No row: nothing was taken over.
UPDATE idempotency_records
SET state = 'in_progress', token = ?5, lease_expires_at = ?6, created_at = ?7,
    expires_at = ?8, lease_boot_id = ?9, lease_ends_boot_ms = ?11
WHERE scope = ?1 AND key = ?2
  AND state = 'in_progress'
  AND lease_left_ms(?7, ?9, ?10) <= 0
  AND expires_at > ?7
  AND fingerprint = ?3 AND fingerprint_version = ?4
RETURNING steps
