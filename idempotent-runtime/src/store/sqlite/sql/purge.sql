-- ?1 now (wall clock), ?2 batch size, ?3 boot id, ?4 now on its clock: expired records
-- under which nothing runs.
DELETE FROM idempotency_records
WHERE rowid IN (
    SELECT rowid FROM idempotency_records
    WHERE expires_at <= ?1 AND (state = 'completed' OR lease_left_ms(?1, ?3, ?4) <= 0)
    LIMIT ?2
)
