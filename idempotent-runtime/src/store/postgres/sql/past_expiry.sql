-- Up to $1 records whose expiry is at or before the database's now(), oldest first (a
-- range scan of the expiry index), and that now: the candidates the sweeper judges. One
-- row with no record when there is none.
SELECT r.scope, r.key, {record}, floor(extract(epoch FROM now()) * 1000)::bigint AS now_ms
FROM (VALUES (1)) AS one (x)
LEFT JOIN LATERAL (
    SELECT * FROM {t} WHERE expires_at <= now() ORDER BY expires_at LIMIT $1
) AS r ON true
