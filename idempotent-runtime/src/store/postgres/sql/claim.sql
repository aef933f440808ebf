-- Insert-or-take-over, and otherwise the existing record, in one statement.
-- {t} is the store's (possibly schema-qualified) table.
--
-- $1 scope, $2 key, $3 fingerprint digest, $4 fingerprint version, $5 token, $6 ttl,
-- $7 lease (intervals; every time is the database's now()).
--
-- - `existing` reads the record from the statement's snapshot.
-- - `claimed` is the atomic insert-or-take-over. It is only attempted when the snapshot
--   shows no record or one the takeover rule lets this request take: for a live record
--   it cannot take (completed, leased, or another fingerprint) the answer comes from the
--   snapshot without writing anything. (Attempting anyway would lock the row even though
--   the DO UPDATE ... WHERE refuses it: every replay and every 409 a write transaction,
--   and a burst of retries of one key queued on that row lock.)
-- - The DO UPDATE only takes over the very record the snapshot showed (same token and
--   state) and only while the takeover rule still holds for its newest version. So the
--   reason reported, computed from the snapshot, is the reason the record was taken
--   for; a record that changed since the snapshot is left alone, nothing is returned,
--   and the store runs the claim again with a fresh snapshot.
-- - The final SELECT returns the claim (with its takeover reason, NULL for a new key),
--   or else the snapshot's record, judged at now(), with headers and body only for a
--   completed same-fingerprint record. The lease and TTL time left use clock_timestamp()
--   (the TTL's rounded down: it bounds the replay cache's copy of the record).
WITH existing AS (
    SELECT state, token, status, headers, body, expires_at,
           expires_at <= now() AS ttl_ran_out,
           lease_expires_at <= now() AS lease_ran_out,
           (fingerprint = $3 AND fingerprint_version = $4) AS same_fingerprint,
           lease_expires_at
    FROM {t}
    WHERE scope = $1 AND key = $2
),
takeover AS (
    -- The takeover rule (src/store/takeover.rs) on the snapshot's record.
    SELECT CASE
               WHEN e.ttl_ran_out AND (e.state = 'completed' OR e.lease_ran_out)
                   THEN 'expired'
               WHEN e.state = 'in_progress' AND e.lease_ran_out AND e.same_fingerprint
                   THEN 'lease_lost'
           END AS reason
    FROM existing e
),
claimed AS (
    INSERT INTO {t} AS r
        (scope, key, fingerprint, fingerprint_version, state, token,
         lease_expires_at, status, headers, body, created_at, expires_at)
    SELECT $1, $2, $3, $4, 'in_progress', $5,
           now() + $7, NULL, NULL, NULL, now(), now() + $6
    WHERE NOT EXISTS (SELECT 1 FROM takeover WHERE reason IS NULL)
    ON CONFLICT (scope, key) DO UPDATE SET
        fingerprint = EXCLUDED.fingerprint,
        fingerprint_version = EXCLUDED.fingerprint_version,
        state = 'in_progress',
        token = EXCLUDED.token,
        lease_expires_at = EXCLUDED.lease_expires_at,
        status = NULL,
        headers = NULL,
        body = NULL,
        created_at = EXCLUDED.created_at,
        expires_at = EXCLUDED.expires_at
    WHERE (r.token, r.state) = (SELECT e.token, e.state FROM existing e)
      AND ((r.expires_at <= now()
            AND (r.state = 'completed' OR r.lease_expires_at <= now()))
           OR (r.state = 'in_progress'
               AND r.lease_expires_at <= now()
               AND r.fingerprint = EXCLUDED.fingerprint
               AND r.fingerprint_version = EXCLUDED.fingerprint_version))
    RETURNING 1
)
SELECT TRUE AS claimed,
       (SELECT reason FROM takeover) AS takeover,
       NULL::text AS state,
       NULL::boolean AS ttl_ran_out,
       NULL::boolean AS lease_ran_out,
       NULL::boolean AS same_fingerprint,
       NULL::bigint AS lease_remaining_ms,
       NULL::bigint AS ttl_remaining_ms,
       NULL::smallint AS status,
       NULL::bytea AS headers,
       NULL::bytea AS body
FROM claimed
UNION ALL
SELECT FALSE,
       NULL,
       e.state,
       e.ttl_ran_out,
       e.lease_ran_out,
       e.same_fingerprint,
       ceil(extract(epoch FROM e.lease_expires_at - clock_timestamp()) * 1000)::bigint,
       floor(extract(epoch FROM e.expires_at - clock_timestamp()) * 1000)::bigint,
       CASE WHEN e.same_fingerprint THEN e.status END,
       CASE WHEN e.same_fingerprint THEN e.headers END,
       CASE WHEN e.same_fingerprint THEN e.body END
FROM existing e
WHERE NOT EXISTS (SELECT 1 FROM claimed)
