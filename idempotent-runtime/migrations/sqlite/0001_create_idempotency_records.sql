-- Idempotency records, schema v1 (DESIGN.md §4).
--
-- One row per (scope, key). Times are INTEGER milliseconds since the Unix epoch, taken
-- from the store's clock (never SQLite's), so tests can inject one.
--
-- state = 'in_progress': a claim owned by `token` until `lease_expires_at`; no response.
-- state = 'completed':   `status` and `headers` are set; `body` NULL means the response
--                        body was larger than the engine's cap and was not stored.
-- A row whose `expires_at` has passed is treated as absent and may be taken over.
CREATE TABLE IF NOT EXISTS idempotency_records (
    scope               TEXT    NOT NULL,
    key                 TEXT    NOT NULL,
    fingerprint         BLOB    NOT NULL CHECK (length(fingerprint) = 32),
    fingerprint_version INTEGER NOT NULL,
    state               TEXT    NOT NULL CHECK (state IN ('in_progress', 'completed')),
    token               INTEGER NOT NULL,
    lease_expires_at    INTEGER NULL,
    status              INTEGER NULL CHECK (status BETWEEN 100 AND 999),
    headers             BLOB    NULL,
    body                BLOB    NULL,
    created_at          INTEGER NOT NULL,
    expires_at          INTEGER NOT NULL,
    PRIMARY KEY (scope, key),
    CHECK (
        (state = 'in_progress' AND lease_expires_at IS NOT NULL
            AND status IS NULL AND headers IS NULL AND body IS NULL)
        OR
        (state = 'completed' AND lease_expires_at IS NULL
            AND status IS NOT NULL AND headers IS NOT NULL)
    )
) STRICT;

-- purge_expired scans by expiry.
CREATE INDEX IF NOT EXISTS idempotency_records_expires_at
    ON idempotency_records (expires_at);
