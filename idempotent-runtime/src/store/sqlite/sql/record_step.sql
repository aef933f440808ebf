-- Appends one encoded step (?4, `encode_step`) to the steps of the in-progress record of
-- ?1 scope, ?2 key that ?3 token owns, fenced like complete.sql. `||` yields TEXT (its
-- bytes unchanged, NUL and 0xFF included), which the CAST keeps a BLOB: a STRICT BLOB
-- column refuses TEXT.
UPDATE idempotency_records
SET steps = CAST(coalesce(steps, X'') || ?4 AS BLOB)
WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = 'in_progress'
