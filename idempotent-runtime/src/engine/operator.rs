//! The operator tools on the engine: look at one record, and delete one to unblock its
//! key. Not exposed to clients (no route); an app wires them into its own admin tooling.

use tracing::{info, warn};

use super::{Idempotency, bounded};
use crate::store::{ForgetOutcome, RecordInfo, StoreError};

impl Idempotency {
    /// The live record of `(scope, key)` as the store sees it now (state, fingerprint,
    /// recorded status, created/expiry times, lease and whether its holder is alive), or
    /// `None` when there is none; see [`Store::inspect`](crate::Store::inspect).
    ///
    /// # Errors
    ///
    /// The store's error, or [`StoreError::Timeout`] after the engine's store timeout.
    pub async fn inspect(&self, scope: &str, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        bounded(
            self.inner.store_timeout,
            self.inner.store.inspect(scope, key),
        )
        .await
    }

    /// Deletes the record of `(scope, key)` so the next request with the key runs as new;
    /// refuses ([`ForgetOutcome::Refused`]) while a request runs under it with a live
    /// lease, unless `force`. See [`Store::forget`](crate::Store::forget) for the exact
    /// rules. A forced forget lets a retry run the handler while the original may still
    /// be running: use it only when the holder is known to be gone (its process died, and
    /// its lease has not run out yet). If it is still running after all, its next
    /// heartbeat finds the claim gone and raises
    /// [`IdempotencyKey::lease_lost`](crate::IdempotencyKey::lease_lost), a transactional
    /// handler's writes roll back, and its response is not recorded (fencing).
    ///
    /// This engine's [replay cache](crate::IdempotencyBuilder::replay_cache) drops the
    /// key at once; other instances' caches may still replay a completed record for up to
    /// their [`max_age`](crate::engine::ReplayCacheConfig::max_age) (default 10 s).
    ///
    /// Every call is logged (`event = "forgotten"`, or `"forget_refused"`).
    ///
    /// # Errors
    ///
    /// The store's error, or [`StoreError::Timeout`] after the engine's store timeout
    /// (the record may or may not have been deleted then: inspect or forget again).
    pub async fn forget(
        &self,
        scope: &str,
        key: &str,
        force: bool,
    ) -> Result<ForgetOutcome, StoreError> {
        let result = bounded(
            self.inner.store_timeout,
            self.inner.store.forget(scope, key, force),
        )
        .await;
        // Whatever `result` is: a forget that timed out may still have deleted the record,
        // and dropping a cached entry is always safe. (A replay read from the store just
        // before the delete may still land in the cache after this: it lives at most the
        // cache's maximum age, like other instances' copies.)
        self.forget_cached(scope, key);
        match &result {
            Ok(ForgetOutcome::Refused { lease_left }) => info!(
                event = "forget_refused",
                scope,
                key,
                lease_left_ms = u64::try_from(lease_left.as_millis()).unwrap_or(u64::MAX),
                "idempotency record not forgotten: a request holds its lease"
            ),
            Ok(outcome) => info!(
                event = "forgotten",
                scope,
                key,
                force,
                found = matches!(outcome, ForgetOutcome::Forgotten(_)),
                "idempotency record forgotten by an operator"
            ),
            Err(err) => warn!(
                event = "store_error",
                scope,
                key,
                error = %err,
                "forgetting an idempotency record failed"
            ),
        }
        result
    }
}
