-- The completions of a batch (group commit, `group_commit.rs`) in one statement, each
-- fenced as `complete.sql` is. Arrays with one element per completion, whose (scope,
-- key) pairs are distinct: $1 scopes, $2 keys, $3 tokens, $4 statuses, $5 headers,
-- $6 bodies (NULL: over the cap). Returns the position (1-based) of each completion
-- that took effect. The responses replace the recorded steps.
UPDATE {t} AS r
SET state = 'completed', status = i.status, headers = i.headers, body = i.body, steps = NULL
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::smallint[], $5::bytea[],
            $6::bytea[])
     WITH ORDINALITY AS i(scope, key, token, status, headers, body, n)
WHERE r.scope = i.scope AND r.key = i.key AND r.token = i.token
  AND r.state = 'in_progress'
RETURNING i.n
