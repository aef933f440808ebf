-- Completes each record at the version given, bumping it as `update.sql` does: the
-- `Complete` compare-and-set for a whole batch in one statement (group commit,
-- `group.rs`; `COMPLETE` in `schema.rs` sets the same for a completion inside a
-- handler's transaction). Arrays with one element per completion, keys distinct:
-- $1 scopes, $2 keys, $3 versions, $4 statuses, $5 headers, $6 bodies (NULL: over the
-- cap). The response replaces the steps. A row, `n` its position (1-based), for each
-- completion applied, with the record's new version.
UPDATE {t} AS r
SET state = 'completed', status = i.status, headers = i.headers, body = i.body,
    steps = NULL,
    version = CASE WHEN r.version = 9223372036854775807 THEN -9223372036854775807 - 1
                   ELSE r.version + 1 END
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::smallint[], $5::bytea[],
            $6::bytea[])
     WITH ORDINALITY AS i (scope, key, version, status, headers, body, n)
WHERE r.scope = i.scope AND r.key = i.key AND r.version = i.version
RETURNING i.n, r.version
