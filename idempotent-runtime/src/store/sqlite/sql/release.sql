-- `release` of a record that holds no steps: deletes the in-progress claim ?3 token owns
-- of ?1 scope, ?2 key. No row: it holds steps (release_keep.sql keeps it), or the token
-- owns nothing.
DELETE FROM idempotency_records
WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = 'in_progress' AND steps IS NULL
