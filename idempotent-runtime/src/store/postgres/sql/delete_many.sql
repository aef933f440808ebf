-- Deletes the record of each $1 scope, $2 key (arrays, one element per record, keys
-- distinct) if it is at the $3 version beside it: the sweeper's deletes in one
-- statement. How many it deleted is the rows affected.
DELETE FROM {t} AS r
USING unnest($1::text[], $2::text[], $3::bigint[]) AS d (scope, key, version)
WHERE r.scope = d.scope AND r.key = d.key AND r.version = d.version
