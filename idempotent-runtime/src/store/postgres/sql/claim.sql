-- Insert-or-take-over, and otherwise the existing record, in one statement for a whole
-- batch of claims (group commit, `group_commit.rs`). {t} is the store's (possibly
-- schema-qualified) table.
--
-- Arrays with one element per claim, whose (scope, key) pairs are distinct: $1 scopes,
-- $2 keys, $3 fingerprint digests, $4 fingerprint versions, $5 tokens, $6 TTLs, $7 leases
-- (intervals; every time is the database's now()). One row per claim comes back, `n`
-- its position (1-based).
--
-- Per claim, as for a claim alone:
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
--   for; a record that changed since the snapshot is left alone (its row then says not
--   claimed, and shows no record or one that looks claimable), and the store runs that
--   claim again with a fresh snapshot.
-- - New keys are inserted in the order of `n` (the batch is sorted by scope and key),
--   so two batches lock rows in one order.
-- - A takeover for a lost lease keeps the record's recorded steps, one for an expired
--   record clears them (`steps_survive`), a new key has none. The claim's steps come from
--   the row the takeover wrote (RETURNING), never from the snapshot: under READ COMMITTED
--   the DO UPDATE acts on the newest version of the row, so a step the old owner
--   committed after the snapshot (same token: the takeover still happens) is in the
--   answer, and one it tries after the takeover is fenced off by the new token.
-- - The final SELECT returns the claim (with its takeover reason, NULL for a new key,
--   and its steps),
--   or else the snapshot's record, judged at now(), with headers and body only for a
--   completed same-fingerprint record. The lease and TTL time left use clock_timestamp()
--   (the TTL's rounded down: it bounds the replay cache's copy of the record).
WITH input AS (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::bytea[], $4::smallint[], $5::bigint[],
                $6::interval[], $7::interval[])
         WITH ORDINALITY AS i(scope, key, fingerprint, fingerprint_version, token, ttl,
                              lease, n)
),
existing AS (
    SELECT i.n, r.scope, r.key, r.state, r.token, r.status, r.headers, r.body,
           r.expires_at, r.lease_expires_at,
           r.expires_at <= now() AS ttl_ran_out,
           r.lease_expires_at <= now() AS lease_ran_out,
           (r.fingerprint = i.fingerprint
            AND r.fingerprint_version = i.fingerprint_version) AS same_fingerprint
    FROM input i
    JOIN {t} r ON r.scope = i.scope AND r.key = i.key
),
takeover AS (
    -- The takeover rule (src/store/takeover.rs) on the snapshot's record.
    SELECT e.n,
           CASE
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
    SELECT i.scope, i.key, i.fingerprint, i.fingerprint_version, 'in_progress', i.token,
           now() + i.lease, NULL, NULL, NULL, now(), now() + i.ttl
    FROM input i
    WHERE NOT EXISTS (SELECT 1 FROM takeover t WHERE t.n = i.n AND t.reason IS NULL)
    ORDER BY i.n
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
        expires_at = EXCLUDED.expires_at,
        -- Kept for the reason reported (LeaseLost), cleared otherwise (`steps_survive`).
        steps = CASE WHEN (SELECT t.reason FROM existing e JOIN takeover t ON t.n = e.n
                           WHERE e.scope = r.scope AND e.key = r.key) = 'lease_lost'
                     THEN r.steps END
    WHERE (r.token, r.state) = (SELECT e.token, e.state FROM existing e
                                WHERE e.scope = r.scope AND e.key = r.key)
      AND ((r.expires_at <= now()
            AND (r.state = 'completed' OR r.lease_expires_at <= now()))
           OR (r.state = 'in_progress'
               AND r.lease_expires_at <= now()
               AND r.fingerprint = EXCLUDED.fingerprint
               AND r.fingerprint_version = EXCLUDED.fingerprint_version))
    RETURNING r.scope, r.key, r.steps
)
SELECT i.n,
       (c.key IS NOT NULL) AS claimed,
       t.reason AS takeover,
       c.steps,
       e.state,
       e.ttl_ran_out,
       e.lease_ran_out,
       e.same_fingerprint,
       ceil(extract(epoch FROM e.lease_expires_at - clock_timestamp()) * 1000)::bigint
           AS lease_remaining_ms,
       floor(extract(epoch FROM e.expires_at - clock_timestamp()) * 1000)::bigint
           AS ttl_remaining_ms,
       CASE WHEN c.key IS NULL AND e.same_fingerprint THEN e.status END AS status,
       CASE WHEN c.key IS NULL AND e.same_fingerprint THEN e.headers END AS headers,
       CASE WHEN c.key IS NULL AND e.same_fingerprint THEN e.body END AS body
FROM input i
LEFT JOIN claimed c ON c.scope = i.scope AND c.key = i.key
LEFT JOIN existing e ON e.n = i.n
LEFT JOIN takeover t ON t.n = i.n
