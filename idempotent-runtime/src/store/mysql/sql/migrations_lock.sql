-- The named lock that serialises migrations on one database: 1 once held, 0 when ? seconds
-- passed first. (sqlx's own migration lock asks for GET_LOCK(name, -1), "wait forever",
-- which MariaDB answers NULL at once without taking the lock.) Lock names are at most 64
-- characters, database names up to 64: the name carries a digest of the database name.
SELECT GET_LOCK(CONCAT('idempotent_migrations_', LEFT(SHA2(COALESCE(DATABASE(), ''), 256), 40)), ?)
