-- The record of $1 scope, $2 key as an operator sees it, judged at the database's now():
-- `inspect`, and the read `forget` decides on. Times as microseconds since the epoch;
-- `steps` (encoded) only for a record in progress.
SELECT state, token, fingerprint, fingerprint_version::bigint AS fingerprint_version,
       status::bigint AS status,
       (extract(epoch FROM created_at) * 1000000)::bigint AS created_at_us,
       (extract(epoch FROM expires_at) * 1000000)::bigint AS expires_at_us,
       (extract(epoch FROM lease_expires_at) * 1000000)::bigint AS lease_expires_at_us,
       (expires_at > now() OR (state = 'in_progress' AND lease_expires_at > now())) AS live,
       CASE WHEN state = 'in_progress' THEN lease_expires_at > now() END AS lease_alive,
       CASE WHEN state = 'in_progress'
            THEN ceil(extract(epoch FROM lease_expires_at - now()) * 1000)::bigint
       END AS lease_left_ms,
       CASE WHEN state = 'in_progress' THEN steps END AS steps
FROM {t}
WHERE scope = $1 AND key = $2
