-- Inserts each claim's record unless its key has one; otherwise answers the record there,
-- read from the statement's snapshot, and the database's clock. A whole batch in one
-- statement (group commit, `group.rs`): arrays with one element per claim, keys distinct
-- and sorted: $1 scopes, $2 keys, $3 fingerprint digests, $4 fingerprint versions,
-- $5 tokens, $6 versions, $7 TTLs, $8 leases (times from the database's now()). One row
-- per claim, `n` its position (1-based).
--
-- A record inserted by a transaction that committed after the snapshot was taken stops
-- the insert yet is not in the snapshot: its row then shows neither, and the store reads
-- it with a statement of its own.
WITH input AS (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::bytea[], $4::smallint[], $5::bigint[],
                $6::bigint[], $7::interval[], $8::interval[])
         WITH ORDINALITY AS i (scope, key, fingerprint, fingerprint_version, token, version,
                               ttl, lease, n)
),
inserted AS (
    INSERT INTO {t} (scope, key, fingerprint, fingerprint_version, state, token, version,
                     lease_expires_at, created_at, expires_at)
    SELECT scope, key, fingerprint, fingerprint_version, 'in_progress', token, version,
           now() + lease, now(), now() + ttl
    FROM input
    ORDER BY n
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING scope, key
)
SELECT i.n, (d.key IS NOT NULL) AS inserted, {record}, {now}
FROM input i
LEFT JOIN inserted d ON d.scope = i.scope AND d.key = i.key
LEFT JOIN {t} r ON d.key IS NULL AND r.scope = i.scope AND r.key = i.key
