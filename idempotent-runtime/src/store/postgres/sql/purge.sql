-- $1 batch size. The oldest expired records, found by a range scan of the expiry index
-- (ORDER BY: without it the planner scans the table sequentially once expired rows are
-- a large share of it, past every live row and the dead rows of earlier batches on each
-- batch), then deleted by row address (ctid) instead of a primary-key lookup each. Rows
-- locked elsewhere (a claim taking one over, another sweeper) are skipped, not waited
-- for; a locked row keeps its address until this statement commits, and the outer
-- condition re-checks expiry on it.
DELETE FROM {t}
WHERE ctid = ANY (ARRAY(SELECT ctid FROM {t}
                        WHERE expires_at <= now()
                          AND (state = 'completed' OR lease_expires_at <= now())
                        ORDER BY expires_at
                        LIMIT $1
                        FOR UPDATE SKIP LOCKED))
  AND expires_at <= now()
  AND (state = 'completed' OR lease_expires_at <= now())
