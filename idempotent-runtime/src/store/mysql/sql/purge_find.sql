-- Up to ? expired records under which nothing runs, oldest first, by id. A consistent
-- read: it locks no range of the expiry index, so sweepers never make claims wait for a
-- gap lock (`purge_delete.sql` then locks only the rows it deletes, by primary key).
SELECT id
FROM idempotency_records
WHERE expires_at <= UTC_TIMESTAMP(6)
  AND (state = 'completed' OR lease_expires_at <= UTC_TIMESTAMP(6))
ORDER BY expires_at
LIMIT ?
