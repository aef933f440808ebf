-- `forget`'s delete of the record `inspect.sql` read: only that version of it (?3 token,
-- ?4 state), and unless ?5 (force) only while nothing runs under it (completed, or its
-- lease ran out at ?6, now on the wall clock; ?7 boot id, ?8 now on its clock). No row
-- affected: the record changed, forget runs again.
-- ?1 scope, ?2 key.
DELETE FROM idempotency_records
WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = ?4
  AND (?5 OR state = 'completed' OR lease_left_ms(?6, ?7, ?8) <= 0)
