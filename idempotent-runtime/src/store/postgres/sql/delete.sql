-- Deletes the record of $1 scope, $2 key if it is at version $3.
DELETE FROM {t} WHERE scope = $1 AND key = $2 AND version = $3
