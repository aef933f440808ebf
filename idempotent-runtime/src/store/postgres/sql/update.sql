-- Applies a change to the record of $1 scope, $2 key if it is at version $3, bumping the
-- version (wrapping, as an unsigned 64-bit count would); {set} is the change
-- (`records.rs`), its parameters from $4, its times from the database's now(). When the
-- record is at another version (or gone), answers it as the statement's snapshot shows
-- it, and the database's clock: a change committed after the snapshot was taken makes
-- the update miss yet is not in the snapshot, so the answer can show the very version
-- the update was given, and the store then reads the record with a statement of its own.
WITH updated AS (
    UPDATE {t} SET {set},
        version = CASE WHEN version = 9223372036854775807 THEN -9223372036854775807 - 1
                       ELSE version + 1 END
    WHERE scope = $1 AND key = $2 AND version = $3
    RETURNING version
)
SELECT (SELECT version FROM updated) AS updated_version, {record}, {now}
FROM (VALUES (1)) AS one (x)
LEFT JOIN {t} r ON r.scope = $1 AND r.key = $2 AND NOT EXISTS (SELECT 1 FROM updated)
