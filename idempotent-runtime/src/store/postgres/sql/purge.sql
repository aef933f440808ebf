-- $1 batch size. Rows locked elsewhere (a claim taking one over, another sweeper) are
-- skipped, not waited for; the outer condition re-checks expiry on the locked row.
DELETE FROM {t}
WHERE (scope, key) IN (SELECT scope, key FROM {t}
                       WHERE expires_at <= now()
                         AND (state = 'completed' OR lease_expires_at <= now())
                       LIMIT $1
                       FOR UPDATE SKIP LOCKED)
  AND expires_at <= now()
  AND (state = 'completed' OR lease_expires_at <= now())
