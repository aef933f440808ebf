-- $1 scope, $2 key, $3 token, $4 status, $5 headers, $6 body (NULL: over the cap). The
-- response replaces the recorded steps.
UPDATE {t} SET state = 'completed', status = $4, headers = $5, body = $6, steps = NULL
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'
