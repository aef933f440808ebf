-- Idempotency records, schema v1 (DESIGN.md §4).
--
-- One row per (scope, key). Every timestamp is written from the database's clock
-- (now()), never an application instance's, so all instances agree on expiry and leases.
--
-- Idempotent on purpose: sqlx's migrator already serialises concurrent starts with an
-- advisory lock, and IF NOT EXISTS keeps a re-run (e.g. a lost migrations table, or a
-- table created by hand from this file) harmless.

CREATE TABLE IF NOT EXISTS idempotency_records (
    scope               TEXT        NOT NULL,
    key                 TEXT        NOT NULL,
    fingerprint         BYTEA       NOT NULL,
    fingerprint_version SMALLINT    NOT NULL,
    state               TEXT        NOT NULL
        CONSTRAINT idempotency_records_state_check
        CHECK (state IN ('in_progress', 'completed')),
    token               BIGINT      NOT NULL,
    lease_expires_at    TIMESTAMPTZ NOT NULL,
    -- Set together when the claim completes; body NULL with a status means the response
    -- was over the stored-response cap.
    status              SMALLINT    NULL,
    headers             BYTEA       NULL,
    body                BYTEA       NULL,
    created_at          TIMESTAMPTZ NOT NULL,
    expires_at          TIMESTAMPTZ NOT NULL,
    CONSTRAINT idempotency_records_pkey PRIMARY KEY (scope, key),
    CONSTRAINT idempotency_records_completed_check
        CHECK (state <> 'completed' OR (status IS NOT NULL AND headers IS NOT NULL))
);

-- purge_expired scans by expiry.
CREATE INDEX IF NOT EXISTS idempotency_records_expires_at_idx
    ON idempotency_records (expires_at);
