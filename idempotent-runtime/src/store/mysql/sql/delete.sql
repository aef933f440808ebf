-- Deletes the record of ? scope_key_sha256, ? scope, ? key if it is at ? version: by the
-- unique scope_key_sha256, so it locks that one row, never a range of the expiry index.
DELETE FROM idempotency_records
WHERE scope_key_sha256 = ? AND scope = ? AND `key` = ? AND version = ?
