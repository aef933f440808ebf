-- The record of ?1 scope, ?2 key as an operator sees it, judged at ?3 (now, milliseconds
-- from the store's clock): `inspect`, and the read `forget` decides on.
SELECT state, token, fingerprint, fingerprint_version, status,
       created_at * 1000 AS created_at_us,
       expires_at * 1000 AS expires_at_us,
       lease_expires_at * 1000 AS lease_expires_at_us,
       (expires_at > ?3 OR (state = 'in_progress' AND lease_expires_at > ?3)) AS live,
       lease_expires_at > ?3 AS lease_alive,
       lease_expires_at - ?3 AS lease_left_ms
FROM idempotency_records
WHERE scope = ?1 AND key = ?2
