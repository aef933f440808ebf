-- Up to ? records whose expiry is at or before the database's UTC_TIMESTAMP(6), oldest
-- first (a range of the expiry index), and that now: the candidates the sweeper judges.
-- A consistent read: it locks no range of the index, so sweepers never make claims wait
-- (the deletions, delete_many.sql, then lock only their rows). One row with no record when
-- there is none.
SELECT r.scope, r.`key`, {record}, {now}
FROM (SELECT 1 AS x) AS one
LEFT JOIN (
    SELECT * FROM idempotency_records
    WHERE expires_at <= UTC_TIMESTAMP(6)
    ORDER BY expires_at
    LIMIT ?
) AS r ON TRUE
