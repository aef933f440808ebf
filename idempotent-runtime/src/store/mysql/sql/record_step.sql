-- record_step: appends one encoded step (store::encode_step) to the record's steps,
-- fenced like complete.sql (only while the token holds the record in progress). The
-- length check keeps the result within max_allowed_packet: past it CONCAT yields NULL,
-- which outside strict mode would silently drop every step recorded so far.
-- ? encoded step, ? scope_key_sha256, ? scope, ? key, ? token, ? encoded step's length.
UPDATE idempotency_records
SET steps = CONCAT(COALESCE(steps, X''), ?)
WHERE scope_key_sha256 = ? AND scope = ? AND `key` = ? AND token = ?
  AND state = 'in_progress'
  AND COALESCE(LENGTH(steps), 0) + ? <= @@max_allowed_packet
