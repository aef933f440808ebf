-- $1 scope, $2 key, $3 token, $4 lease, $5 TTL: the record lives at least that long from now.
UPDATE {t} SET lease_expires_at = now() + $4, expires_at = GREATEST(expires_at, now() + $5)
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'
