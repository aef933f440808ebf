-- A batch of claims in one request (group_commit.rs), two autocommitted statements.
--
-- 1. Insert every claim's in-progress record whose key has none. INSERT IGNORE, so a key
--    that has a record (a replay, a duplicate, a takeover candidate, or a key twice in
--    the batch) is skipped rather than failing the batch; a skipped row writes nothing.
--    claim.rs refuses a scope or key too long for its column before it is sent, as IGNORE
--    would store it cut short instead of failing. A VALUES list, not INSERT … SELECT:
--    InnoDB knows how many ids a VALUES list takes, so it hands them out under a mutex,
--    where an INSERT … SELECT would hold the table's AUTO-INC lock to the statement's end
--    (innodb_autoinc_lock_mode = 1, MariaDB's default), and a batch waiting on a row
--    lock would hold up every other instance's inserts.
-- 2. Read every claim's record, judged at this statement's UTC_TIMESTAMP(6) as the
--    takeover rule needs it: a consistent (non-locking) read of what is committed, the
--    insert included. A record holding the claim's token is the claim's own (claimed);
--    any other is another claim's, judged as claim_read was before: replay, in progress
--    (lease left), mismatch, or claimable for a takeover. The response columns only for
--    the same fingerprint (a mismatch does not ship the body). STRAIGHT_JOIN: the batch
--    first, each record by its unique scope_key_sha256, whatever the table's statistics
--    say.
--
-- The insert's rows (its placeholder below) are one claim_batch_row.sql per claim, and the
-- read's batch the UNION ALL of one claim_batch_element.sql per claim, both sorted by
-- scope_key_sha256 so concurrent batches lock rows in one order.
INSERT IGNORE INTO idempotency_records
    (scope_key_sha256, scope, `key`, fingerprint, fingerprint_version, state, token,
     lease_expires_at, status, headers, body, created_at, expires_at)
VALUES {rows};
SELECT c.n,
       r.token = c.token AS claimed,
       r.state,
       r.expires_at <= UTC_TIMESTAMP(6) AS ttl_ran_out,
       r.lease_expires_at <= UTC_TIMESTAMP(6) AS lease_ran_out,
       (r.fingerprint = c.fingerprint AND r.fingerprint_version = c.version)
           AS same_fingerprint,
       CAST(CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), r.lease_expires_at) / 1000)
            AS SIGNED) AS lease_remaining_ms,
       CAST(FLOOR(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), r.expires_at) / 1000)
            AS SIGNED) AS ttl_remaining_ms,
       IF(r.fingerprint = c.fingerprint AND r.fingerprint_version = c.version,
          r.status, NULL) AS status,
       IF(r.fingerprint = c.fingerprint AND r.fingerprint_version = c.version,
          r.headers, NULL) AS headers,
       IF(r.fingerprint = c.fingerprint AND r.fingerprint_version = c.version,
          r.body, NULL) AS body
FROM ({claims}) AS c
STRAIGHT_JOIN idempotency_records AS r
    ON r.scope_key_sha256 = c.id AND r.scope = c.scope AND r.`key` = c.k
