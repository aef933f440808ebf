-- The claim's first statement, a plain read: the record of ?1 scope, ?2 key, judged at
-- ?3 (now on the wall clock; ?6 boot id, ?7 now on its clock, for the lease rule) as the
-- takeover rule needs it. No row: `claim_new.sql` inserts; a record that refuses the
-- claim (replay, in progress, mismatch) is answered from this read alone; one the rule
-- lets the claim replace goes to a takeover statement.
-- ?4 fingerprint, ?5 fingerprint version.
SELECT state,
       expires_at <= ?3 AS ttl_ran_out,
       coalesce(lease_left_ms(?3, ?6, ?7) <= 0, 0) AS lease_ran_out,
       (fingerprint = ?4 AND fingerprint_version = ?5) AS same_fingerprint,
       lease_left_ms(?3, ?6, ?7) AS lease_remaining_ms,
       expires_at - ?3 AS ttl_remaining_ms,
       status, headers, body
FROM idempotency_records
WHERE scope = ?1 AND key = ?2
