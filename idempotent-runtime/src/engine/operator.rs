//! The operator tools: look at one record, and delete one to unblock its key. Not
//! exposed to clients (no route); an app wires them into its own admin tooling through
//! [`Idempotency::inspect`](super::Idempotency::inspect) and
//! [`Idempotency::forget`](super::Idempotency::forget).

use tracing::{info, warn};

use super::Inner;
use super::store_call::bounded;
use crate::store::{ForgetOutcome, RecordInfo, StoreError};

/// The live record of `(scope, key)` as the store sees it now, bounded by the engine's
/// store timeout.
pub(super) async fn inspect(
    inner: &Inner,
    scope: &str,
    key: &str,
) -> Result<Option<RecordInfo>, StoreError> {
    bounded(inner.store_timeout, inner.store.inspect(scope, key)).await
}

/// Deletes the record of `(scope, key)` (see [`Idempotency::forget`](super::Idempotency::forget)),
/// drops it from this process's replay cache and logs the call.
pub(super) async fn forget(
    inner: &Inner,
    scope: &str,
    key: &str,
    force: bool,
) -> Result<ForgetOutcome, StoreError> {
    let result = bounded(inner.store_timeout, inner.store.forget(scope, key, force)).await;
    // Whatever `result` is: a forget that timed out may still have deleted the record,
    // and dropping a cached entry is always safe. (A replay read from the store just
    // before the delete may still land in the cache after this: it lives at most the
    // cache's maximum age, like other instances' copies.)
    inner.forget_cached(scope, key);
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
