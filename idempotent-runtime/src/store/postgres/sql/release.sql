-- $1 scope, $2 key, $3 token, $4 the released token (`FencingToken::RELEASED`). Gives up
-- the claim the token owns, in one statement: a record without steps is deleted; one
-- with steps is kept in progress with its lease ended at the database's now() and its
-- token set to $4 (`release_keeps_record`), so the released owner is fenced off as after
-- a delete and the same request's next claim takes it over (LeaseLost) and resumes. The
-- kept record's `waited` is cleared, which notifies its waiters as the delete does
-- (migration 4). `released` is 1 when the token owned the record, else 0.
--
-- Both branches are fenced like `complete.sql`; they exclude each other on `steps`, so
-- at most one acts. (Only the owner appends steps, and never while it releases.)
WITH kept AS (
    UPDATE {t} SET lease_expires_at = now(), token = $4, waited = false
    WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'
      AND steps IS NOT NULL
    RETURNING 1
), deleted AS (
    DELETE FROM {t}
    WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'
      AND steps IS NULL
    RETURNING 1
)
SELECT (SELECT count(*) FROM kept) + (SELECT count(*) FROM deleted) AS released
