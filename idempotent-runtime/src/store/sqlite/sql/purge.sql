-- ?1 now, ?2 batch size: expired records under which nothing runs.
DELETE FROM idempotency_records
WHERE rowid IN (
    SELECT rowid FROM idempotency_records
    WHERE expires_at <= ?1 AND (state = 'completed' OR lease_expires_at <= ?1)
    LIMIT ?2
)
