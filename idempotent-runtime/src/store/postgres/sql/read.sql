-- The record of $1 scope, $2 key, if any, and the database's clock.
SELECT {record}, {now}
FROM (VALUES (1)) AS one (x)
LEFT JOIN {t} r ON r.scope = $1 AND r.key = $2
