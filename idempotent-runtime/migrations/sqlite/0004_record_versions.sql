-- Record versions: every write of a record bumps `version`, and the store changes a
-- record only while it is at the version its decision read (a compare-and-set), so that
-- deciding in the engine and then writing cannot race a renewal or a takeover
-- (src/store/fenced/).
--
-- Added in place: existing records start at version 0 (ADD COLUMN takes no expression
-- as its default, and rewrites no row).
--
-- While processes of an earlier release still share the file, their writes (fenced by
-- token, not version) must still move the version, or an upgraded owner's
-- compare-and-set would overwrite an older process's takeover: the first trigger bumps
-- the version of an update that left it alone yet changed the record (the store's own
-- updates always set it). Their inserts take the default, 0; the second trigger gives
-- such a record a random version, as the store's own inserts have, so that a record
-- deleted and inserted again never repeats a version an owner of the deleted one could
-- still compare against.
ALTER TABLE idempotency_records ADD COLUMN version INTEGER NOT NULL DEFAULT 0;

CREATE TRIGGER IF NOT EXISTS idempotency_records_unversioned_write
AFTER UPDATE ON idempotency_records
FOR EACH ROW
WHEN NEW.version = OLD.version
     AND NOT (NEW.token IS OLD.token AND NEW.state IS OLD.state
              AND NEW.lease_expires_at IS OLD.lease_expires_at
              AND NEW.lease_ends_boot_ms IS OLD.lease_ends_boot_ms
              AND NEW.expires_at IS OLD.expires_at AND NEW.steps IS OLD.steps)
BEGIN
    UPDATE idempotency_records
    SET version = CASE WHEN OLD.version = 9223372036854775807 THEN -9223372036854775807 - 1
                       ELSE OLD.version + 1 END
    WHERE scope = NEW.scope AND key = NEW.key;
END;

CREATE TRIGGER IF NOT EXISTS idempotency_records_unversioned_insert
AFTER INSERT ON idempotency_records
FOR EACH ROW
WHEN NEW.version = 0
BEGIN
    UPDATE idempotency_records SET version = random()
    WHERE scope = NEW.scope AND key = NEW.key;
END;
