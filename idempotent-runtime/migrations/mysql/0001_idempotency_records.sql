-- Idempotency records on MySQL 8 / MariaDB 10.6+, schema v1.
--
-- One row per (scope, key). Scopes have no length limit and a key may be 255 characters,
-- more than an InnoDB index holds for two utf8mb4 columns, so the primary key is
-- scope_key_sha256: SHA-256 over the scope's byte length (8 bytes, big-endian), the
-- scope and the key, computed by the store. scope and `key` are kept as binary strings
-- (compared byte for byte: case and trailing spaces matter) and every statement checks
-- them too.
--
-- Times are DATETIME(6) in UTC, written from the database's UTC_TIMESTAMP(6), never an
-- application instance's clock, and never in a session time zone (no DST, no 2038).
--
-- One statement (MySQL commits DDL implicitly; sqlx's migrator holds GET_LOCK while it
-- runs), and IF NOT EXISTS keeps a re-run harmless.
CREATE TABLE IF NOT EXISTS idempotency_records (
    scope_key_sha256    BINARY(32)     NOT NULL,
    scope               BLOB           NOT NULL,
    `key`               BLOB           NOT NULL,
    fingerprint         VARBINARY(64)  NOT NULL,
    fingerprint_version SMALLINT       NOT NULL,
    state               VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    token               BIGINT         NOT NULL,
    lease_expires_at    DATETIME(6)    NOT NULL,
    -- Set together when the claim completes; body NULL with a status means the response
    -- was over the stored-response cap.
    status              SMALLINT       NULL,
    headers             MEDIUMBLOB     NULL,
    body                LONGBLOB       NULL,
    created_at          DATETIME(6)    NOT NULL,
    expires_at          DATETIME(6)    NOT NULL,
    CONSTRAINT idempotency_records_pkey PRIMARY KEY (scope_key_sha256),
    -- purge_expired scans by expiry.
    INDEX idempotency_records_expires_at_idx (expires_at),
    CONSTRAINT idempotency_records_state_check
        CHECK (state IN ('in_progress', 'completed')),
    CONSTRAINT idempotency_records_completed_check
        CHECK (state <> 'completed' OR (status IS NOT NULL AND headers IS NOT NULL))
) ENGINE = InnoDB
