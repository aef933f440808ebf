-- ? status, ? headers, ? body (NULL: over the cap), ? scope_key_sha256, ? scope, ? key,
-- ? token. The response replaces the steps recorded under the claim.
UPDATE idempotency_records
SET state = 'completed', status = ?, headers = ?, body = ?, steps = NULL
WHERE scope_key_sha256 = ? AND scope = ? AND `key` = ? AND token = ?
  AND state = 'in_progress'
