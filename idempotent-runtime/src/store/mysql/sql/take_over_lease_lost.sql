-- Takes over an in-progress record within its TTL whose lease ran out, for a retry with
-- the same fingerprint: Takeover::LeaseLost. Same guarantees as take_over_expired.sql.
-- The steps survive (store::steps_survive) and the claim answers with them, so the
-- request is two autocommitted statements sent as one (text protocol, every value a
-- literal, group_commit::inline): the fenced UPDATE, then a read of the steps filtered by
-- the *new* token. MySQL has no UPDATE … RETURNING; the read starts after the UPDATE
-- committed, so it sees the row as the takeover left it: every step the old owner
-- committed before the takeover took the row lock, and none after (the old token is
-- fenced off from then on). No row: the takeover matched nothing, or the record was lost
-- again in between; the claim runs again.
-- ? token, ? lease, ? ttl (microseconds), ? scope_key_sha256, ? scope, ? key,
-- ? fingerprint, ? fingerprint version; then ? scope_key_sha256, ? scope, ? key, ? token.
UPDATE idempotency_records
SET token = ?, lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
    created_at = UTC_TIMESTAMP(6), expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE scope_key_sha256 = ? AND scope = ? AND `key` = ?
  AND state = 'in_progress'
  AND lease_expires_at <= UTC_TIMESTAMP(6)
  AND expires_at > UTC_TIMESTAMP(6)
  AND fingerprint = ? AND fingerprint_version = ?;
SELECT steps
FROM idempotency_records
WHERE scope_key_sha256 = ? AND scope = ? AND `key` = ? AND token = ?
  AND state = 'in_progress'
