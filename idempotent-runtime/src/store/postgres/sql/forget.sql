-- `forget`'s delete of the record `inspect.sql` read: only that version of it ($3 token,
-- $4 state), and unless $5 (force) only while nothing runs under it (completed, or its
-- lease ran out). No row affected: the record changed, forget runs again.
-- $1 scope, $2 key.
DELETE FROM {t}
WHERE scope = $1 AND key = $2 AND token = $3 AND state = $4
  AND ($5 OR state = 'completed' OR lease_expires_at <= now())
