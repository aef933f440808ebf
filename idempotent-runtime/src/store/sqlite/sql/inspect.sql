-- The record of ?1 scope, ?2 key as an operator sees it, judged at ?3 (now, milliseconds
-- on the wall clock; ?4 boot id, ?5 now on its clock): `inspect`, and the read `forget`
-- decides on. The lease's end is shown on today's wall clock: now plus what it has left.
-- `steps`: the encoded steps of an in-progress record (NULL: none; a completed record's
-- were cleared by complete.sql).
SELECT state, token, fingerprint, fingerprint_version, status,
       created_at * 1000 AS created_at_us,
       expires_at * 1000 AS expires_at_us,
       (?3 + lease_left_ms(?3, ?4, ?5)) * 1000 AS lease_expires_at_us,
       (expires_at > ?3 OR (state = 'in_progress' AND lease_left_ms(?3, ?4, ?5) > 0))
           AS live,
       lease_left_ms(?3, ?4, ?5) > 0 AS lease_alive,
       lease_left_ms(?3, ?4, ?5) AS lease_left_ms,
       steps
FROM idempotency_records
WHERE scope = ?1 AND key = ?2
