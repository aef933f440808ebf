-- Applies a change to the record of ? scope_key_sha256, ? scope, ? key if it is at
-- ? version, bumping the version (wrapping, as an unsigned 64-bit count would); {set} is
-- the change (records.rs), its parameters first (MySQL's placeholders are positional),
-- its times from the statement's UTC_TIMESTAMP(6); {also} a further condition of the
-- change (the steps' size limit) with its parameters last. An UPDATE acts on the newest
-- committed row under its exclusive lock, so exactly one of racing compare-and-sets on
-- one version matches. Rows matched (sqlx connects with CLIENT_FOUND_ROWS) say whether it
-- applied; the version is set last, as MySQL assigns left to right.
UPDATE idempotency_records
SET {set},
    version = IF(version = 9223372036854775807, -9223372036854775807 - 1, version + 1)
WHERE scope_key_sha256 = ? AND scope = ? AND `key` = ? AND version = ?{also}
