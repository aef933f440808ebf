-- Recovery points (schema v4): the steps a handler completed under a claim, kept with its
-- record (`store/steps.rs`), and a release that keeps such a record announced like one
-- that deletes it.
--
-- `steps` is the concatenation of the encoded steps in recording order (NULL: none).
-- Adding a nullable column without a default only changes the catalog: existing rows are
-- neither rewritten nor locked for longer than the ALTER itself, and read as NULL.
--
-- A release of a record that holds steps keeps it in progress, ends its lease, gives it
-- the released token and clears `waited` (its waiters are woken now; the next owner's
-- waiters mark it again). That
-- update notifies like the delete of migration 3: only for a record a duplicate waited
-- for. Nothing else sets `waited` from true to false, so renewals, recorded steps and
-- takeovers still notify nothing.
--
-- Idempotent on purpose, like v1 to v3.

ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS steps bytea NULL;

DROP TRIGGER IF EXISTS idempotency_records_released_kept ON idempotency_records;
CREATE TRIGGER idempotency_records_released_kept
    AFTER UPDATE ON idempotency_records
    FOR EACH ROW
    WHEN (OLD.state = 'in_progress' AND NEW.state = 'in_progress'
          AND OLD.waited AND NOT NEW.waited)
    EXECUTE FUNCTION idempotency_claim_ended();
