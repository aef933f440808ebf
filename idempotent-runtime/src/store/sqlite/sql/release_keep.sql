-- `release` of a record that holds steps (`release_keeps_record`): keeps the in-progress
-- claim ?3 token owns of ?1 scope, ?2 key, its lease ended now (?4 on the wall clock; ?5
-- boot id, NULL: on the wall clock; ?6 now on the boot's clock, NULL without a boot) and
-- its token ?7 (FencingToken::RELEASED, which no claim carries: the released owner is
-- fenced off), so the next claim of the same request takes it over (LeaseLost) and
-- resumes.
UPDATE idempotency_records
SET token = ?7, lease_expires_at = ?4, lease_boot_id = ?5, lease_ends_boot_ms = ?6
WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = 'in_progress'
  AND steps IS NOT NULL
