-- ?1 scope, ?2 key, ?3 token.
DELETE FROM idempotency_records
WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = 'in_progress'
