-- Schema v4: record versions. Every write of a record bumps `version`, and the store
-- changes a record only while it is at the version its decision read (a compare-and-set),
-- so that deciding in the engine and then writing cannot race a renewal or a takeover.
--
-- Upgrades a v3 table in place. Existing rows start at version 0: a NOT NULL column with
-- a constant default at the end is an instant, metadata-only change (MariaDB 10.3+,
-- MySQL 8.0.12+), rows are not rewritten. The default then becomes a random version, for
-- later rows only (nothing is rewritten): a record an earlier release inserts after one
-- was deleted never repeats a version an owner of the deleted one could still compare
-- against, as the store's own inserts never do.
--
-- While instances of an earlier release still run beside upgraded ones, their writes
-- (fenced by token, not version) must still move the version, or an upgraded owner's
-- compare-and-set would overwrite an older instance's takeover. The trigger bumps the
-- version of an update that left it alone yet changed the record; the store's own
-- updates always set it. (With binary logging on, MySQL lets an account create a trigger
-- only with log_bin_trust_function_creators or SUPER; MariaDB likewise.)
--
-- Three statements; MySQL commits DDL implicitly, so a run that failed halfway leaves
-- v4 unfinished in _idempotent_migrations and the store refuses to open until an
-- operator finishes or undoes it (see the module docs).
ALTER TABLE idempotency_records ADD COLUMN version BIGINT NOT NULL DEFAULT 0;
ALTER TABLE idempotency_records ALTER COLUMN version
    SET DEFAULT (CAST(CONV(LEFT(MD5(RAND()), 15), 16, 10) AS SIGNED));
CREATE TRIGGER idempotency_records_unversioned_write
    BEFORE UPDATE ON idempotency_records
    FOR EACH ROW
    SET NEW.version = IF(NEW.version = OLD.version
                         AND NOT (NEW.token <=> OLD.token AND NEW.state <=> OLD.state
                                  AND NEW.lease_expires_at <=> OLD.lease_expires_at
                                  AND NEW.expires_at <=> OLD.expires_at
                                  AND NEW.steps <=> OLD.steps),
                         IF(OLD.version = 9223372036854775807, -9223372036854775807 - 1,
                            OLD.version + 1),
                         NEW.version)
