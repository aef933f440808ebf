-- ? status, ? headers, ? body (NULL: over the cap), ? scope_key_sha256, ? scope, ? key,
-- ? token.
UPDATE idempotency_records
SET state = 'completed', status = ?, headers = ?, body = ?
WHERE scope_key_sha256 = ? AND scope = ? AND `key` = ? AND token = ?
  AND state = 'in_progress'
