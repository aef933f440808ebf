-- The record that refused `claim_new.sql`, judged at ?3 (now) as the takeover rule needs
-- it. ?1 scope, ?2 key, ?3 now, ?4 fingerprint, ?5 fingerprint version.
SELECT state,
       expires_at <= ?3 AS ttl_ran_out,
       coalesce(lease_expires_at <= ?3, 0) AS lease_ran_out,
       (fingerprint = ?4 AND fingerprint_version = ?5) AS same_fingerprint,
       lease_expires_at - ?3 AS lease_remaining_ms,
       status, headers, body
FROM idempotency_records
WHERE scope = ?1 AND key = ?2
