-- A batch of inserts in one request (group_commit.rs), two autocommitted statements.
--
-- 1. Insert every claim's in-progress record whose key has none, at the record's first
--    version. INSERT IGNORE, so a key that has a record (or a key twice in the batch) is
--    skipped rather than failing the batch; a skipped row writes nothing. records.rs
--    refuses a scope or key too long for its column before it is sent, as IGNORE would
--    store it cut short instead of failing. A VALUES list, not INSERT … SELECT: InnoDB
--    then hands out the AUTO_INCREMENT ids under a mutex, where an INSERT … SELECT would
--    hold the table's AUTO-INC lock to the statement's end, and a batch waiting on a row
--    lock would hold up every other instance's inserts.
-- 2. Read every claim's record and the database's clock: a consistent (non-locking)
--    read of what is committed, the insert included. A record holding the claim's token
--    is the one the insert wrote (tokens are unique to a claim); any other stopped it.
--    A claim without a row: its record was deleted between the two statements, and the
--    store inserts again. STRAIGHT_JOIN: the batch first, each record by its unique
--    scope_key_sha256, whatever the table's statistics say.
--
-- The insert's rows (its placeholder below) are one insert_row.sql per claim, and the
-- read's batch the UNION ALL of one insert_element.sql per claim, both sorted by
-- scope_key_sha256 so concurrent batches lock rows in one order.
INSERT IGNORE INTO idempotency_records
    (scope_key_sha256, scope, `key`, fingerprint, fingerprint_version, state, token,
     version, lease_expires_at, status, headers, body, created_at, expires_at)
VALUES {rows};
SELECT c.n, r.token = c.token AS inserted, {record}, {now}
FROM ({claims}) AS c
STRAIGHT_JOIN idempotency_records AS r
    ON r.scope_key_sha256 = c.id AND r.scope = c.scope AND r.`key` = c.k
