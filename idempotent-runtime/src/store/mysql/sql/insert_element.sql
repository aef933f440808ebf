-- One claim of insert_batch.sql's read, every value a literal (group_commit::inline).
-- ? position in the batch (0-based), ? scope_key_sha256, ? scope, ? key, ? token.
SELECT ? AS n, ? AS id, ? AS scope, ? AS k, ? AS token
