-- Inserts a claim's record unless the key has one ($1 scope, $2 key, $3 fingerprint
-- digest, $4 fingerprint version, $5 token, $6 version, $7 TTL, $8 lease: times from the
-- database's now()); otherwise answers the record there, read from the statement's
-- snapshot, and the database's clock. A record inserted by a transaction that committed
-- after the snapshot was taken stops the insert yet is not in the snapshot: the answer
-- then shows neither, and the store reads it with a statement of its own.
WITH inserted AS (
    INSERT INTO {t} (scope, key, fingerprint, fingerprint_version, state, token, version,
                     lease_expires_at, created_at, expires_at)
    VALUES ($1, $2, $3, $4, 'in_progress', $5, $6, now() + $8, now(), now() + $7)
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM inserted) AS inserted, {record}, {now}
FROM (VALUES (1)) AS one (x)
LEFT JOIN {t} r ON r.scope = $1 AND r.key = $2 AND NOT EXISTS (SELECT 1 FROM inserted)
