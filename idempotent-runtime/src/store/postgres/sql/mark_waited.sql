-- $1 scope, $2 key. Marks an in-progress record whose lease is live so that its end
-- notifies (migrations 3 and 4): `watched` is true when the record is marked now or was
-- marked by a transaction this statement sees; false when the record is gone,
-- completed, its lease ended (a crashed holder, or a release that kept the record for
-- its steps: claim again to take it over), or changed under the statement (the waiter
-- then claims again at once instead of waiting for a notification that may never come).
--
-- The update checks the lease against clock_timestamp(), not now(): re-checked after a
-- concurrent release committed, it must see that release's lease end (its now()), which
-- may be later than this statement's start.
WITH current AS (
    SELECT waited FROM {t}
    WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND lease_expires_at > now()
), marked AS (
    UPDATE {t} SET waited = true
    WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND NOT waited
      AND lease_expires_at > clock_timestamp()
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM current WHERE waited) OR EXISTS (SELECT 1 FROM marked) AS watched
