-- `forget`'s delete of the record `inspect.sql` read: only that version of it (token,
-- state), and unless forced only while nothing runs under it (completed, or its lease
-- ran out). No row affected: the record changed, forget runs again.
-- ? scope_key_sha256, ? scope, ? key, ? token, ? state, ? force.
DELETE FROM idempotency_records
WHERE scope_key_sha256 = ? AND scope = ? AND `key` = ? AND token = ? AND state = ?
  AND (? OR state = 'completed' OR lease_expires_at <= UTC_TIMESTAMP(6))
