-- Releases `migrations_lock.sql`'s lock (closing the session would too).
SELECT RELEASE_LOCK(CONCAT('idempotent_migrations_', LEFT(SHA2(COALESCE(DATABASE(), ''), 256), 40)))
