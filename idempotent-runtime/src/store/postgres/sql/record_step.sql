-- $1 scope, $2 key, $3 token, $4 one encoded step (`encode_step`): appended to the
-- record's steps, fenced like `complete.sql` (only while the token owns the claim in
-- progress). One row affected: recorded. Under READ COMMITTED a concurrent takeover that
-- commits first changes the token, so the re-checked row no longer matches.
UPDATE {t} SET steps = coalesce(steps, ''::bytea) || $4
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'
