-- Record versions (schema v5): every write of a record bumps `version`, and the store
-- changes a record only while it is at the version its decision read (a compare-and-set),
-- so that deciding in the engine and then writing cannot race a renewal or a takeover.
--
-- Existing records start at version 0. Adding a NOT NULL column with a constant default
-- only changes the catalog: rows are neither rewritten nor locked for longer than the
-- ALTER itself. The default then becomes a random version (for later rows only, so
-- nothing is rewritten), as the store's own inserts have: a record an earlier release
-- inserts after one was deleted never repeats a version an owner of the deleted one
-- could still compare against.
--
-- While instances of an earlier release still run beside upgraded ones, their writes
-- (fenced by token, not version) must still move the version, or an upgraded owner's
-- compare-and-set would overwrite an older instance's takeover. The trigger bumps the
-- version of an update that left it alone yet changed the record; the store's own
-- updates always set it, and marking a record waited changes nothing it compares.
--
-- Idempotent on purpose, like v1 to v4.

ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS version bigint NOT NULL DEFAULT 0;
ALTER TABLE idempotency_records ALTER COLUMN version
    SET DEFAULT ('x' || substr(md5(random()::text || clock_timestamp()::text), 1, 16))::bit(64)::bigint;

CREATE OR REPLACE FUNCTION idempotency_record_bump_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.version := CASE WHEN OLD.version = 9223372036854775807 THEN -9223372036854775807 - 1
                        ELSE OLD.version + 1 END;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS idempotency_records_unversioned_write ON idempotency_records;
CREATE TRIGGER idempotency_records_unversioned_write
    BEFORE UPDATE ON idempotency_records
    FOR EACH ROW
    WHEN (NEW.version = OLD.version
          AND (NEW.token, NEW.state, NEW.lease_expires_at, NEW.expires_at, NEW.steps)
              IS DISTINCT FROM (OLD.token, OLD.state, OLD.lease_expires_at, OLD.expires_at,
                                OLD.steps))
    EXECUTE FUNCTION idempotency_record_bump_version();
