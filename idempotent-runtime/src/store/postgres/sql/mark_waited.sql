-- $1 scope, $2 key. Marks an in-progress record so that its end notifies (migration 3):
-- `watched` is true when the record is marked now or was marked by a transaction this
-- statement sees; false when the record is gone, completed, or changed under the
-- statement (the waiter then claims again at once instead of waiting for a notification
-- that may never come).
WITH current AS (
    SELECT waited FROM {t}
    WHERE scope = $1 AND key = $2 AND state = 'in_progress'
), marked AS (
    UPDATE {t} SET waited = true
    WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND NOT waited
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM current WHERE waited) OR EXISTS (SELECT 1 FROM marked) AS watched
