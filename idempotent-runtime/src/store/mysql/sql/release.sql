-- ? scope_key_sha256, ? scope, ? key, ? token.
DELETE FROM idempotency_records
WHERE scope_key_sha256 = ? AND scope = ? AND `key` = ? AND token = ?
  AND state = 'in_progress'
