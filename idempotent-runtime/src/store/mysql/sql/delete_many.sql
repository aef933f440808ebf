-- Deletes the record of each ? scope_key_sha256, ? scope, ? key if it is at ? version,
-- one `{each}` per record, ORed: the sweeper's deletes in one statement. Each is a point
-- of the unique scope_key_sha256, so it locks those rows, never a range of the expiry
-- index. How many it deleted is the rows affected.
DELETE FROM idempotency_records WHERE {each}
