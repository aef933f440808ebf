-- Deletes the records `purge_find.sql` found, by primary key, re-checking expiry on each
-- locked row (a record claimed again meanwhile stays; ids are never reused, so a record
-- deleted and claimed anew in between is another id). {ids} is one `?` per id.
DELETE FROM idempotency_records
WHERE id IN ({ids})
  AND expires_at <= UTC_TIMESTAMP(6)
  AND (state = 'completed' OR lease_expires_at <= UTC_TIMESTAMP(6))
