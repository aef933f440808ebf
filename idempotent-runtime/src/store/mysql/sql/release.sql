-- release: two autocommitted statements in one request (text protocol, every value a
-- literal, group_commit::inline), both fenced by the token; at most one matches. A
-- record without steps is deleted (the next request claims the key as new); one with
-- steps is kept in progress with its lease ended now, on the database clock, and its
-- token FencingToken::RELEASED, which no claim carries (the released owner is fenced
-- off as after a delete), so the next claim of the same request takes it over
-- (LeaseLost) and resumes after them.
-- Only the owner adds steps and only the owner or a takeover clears them, so what the
-- first statement saw of `steps` still holds for the second unless the token lost the
-- record in between, and then neither matches.
-- ? scope_key_sha256, ? scope, ? key, ? token; ? FencingToken::RELEASED; then
-- ? scope_key_sha256, ? scope, ? key, ? token again.
DELETE FROM idempotency_records
WHERE scope_key_sha256 = ? AND scope = ? AND `key` = ? AND token = ?
  AND state = 'in_progress' AND steps IS NULL;
UPDATE idempotency_records
SET lease_expires_at = UTC_TIMESTAMP(6), token = ?
WHERE scope_key_sha256 = ? AND scope = ? AND `key` = ? AND token = ?
  AND state = 'in_progress' AND steps IS NOT NULL
