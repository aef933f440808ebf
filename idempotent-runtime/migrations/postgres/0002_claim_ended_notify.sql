-- Claim ends announced with NOTIFY (schema v2), for duplicates that wait for the original
-- request (`wait = "5s"`) on other instances.
--
-- When an in-progress claim completes or is released (deleted), the trigger notifies the
-- channel `idempotent_claim_ended` with a compact payload: the first 32 hex digits of
-- SHA-256(scope, a zero byte, key), never the raw key. A notification is delivered when
-- the transaction commits, so a waiter that wakes up finds the change. Renewals and
-- take-overs (in progress to in progress) notify nothing.
--
-- Idempotent on purpose, like v1: CREATE OR REPLACE, DROP TRIGGER IF EXISTS.

CREATE OR REPLACE FUNCTION idempotency_claim_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        'idempotent_claim_ended',
        left(encode(sha256(
            convert_to(OLD.scope, 'UTF8') || decode('00', 'hex') || convert_to(OLD.key, 'UTF8')
        ), 'hex'), 32)
    );
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS idempotency_records_completed ON idempotency_records;
CREATE TRIGGER idempotency_records_completed
    AFTER UPDATE ON idempotency_records
    FOR EACH ROW
    WHEN (OLD.state = 'in_progress' AND NEW.state = 'completed')
    EXECUTE FUNCTION idempotency_claim_ended();

DROP TRIGGER IF EXISTS idempotency_records_released ON idempotency_records;
CREATE TRIGGER idempotency_records_released
    AFTER DELETE ON idempotency_records
    FOR EACH ROW
    WHEN (OLD.state = 'in_progress')
    EXECUTE FUNCTION idempotency_claim_ended();
