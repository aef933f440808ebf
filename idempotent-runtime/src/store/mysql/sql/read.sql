-- The record of ? scope_key_sha256, ? scope, ? key, if any, and the database's clock.
-- {lock}: nothing (a consistent read, outside a transaction), or FOR UPDATE inside a
-- handler's transaction, whose snapshot may predate the newest committed version; a
-- locking read shows that version, as the UPDATE after it will see it.
SELECT {record}, {now}
FROM (SELECT 1 AS x) AS one
LEFT JOIN idempotency_records AS r
    ON r.scope_key_sha256 = ? AND r.scope = ? AND r.`key` = ?
{lock}
