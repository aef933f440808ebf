//! The operator tools: look at one record, and delete one to unblock its key. Not
//! exposed to clients (no route); an app wires them into its own admin tooling through
//! [`Idempotency::inspect`](super::Idempotency::inspect) and
//! [`Idempotency::forget`](super::Idempotency::forget).

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tracing::{info, warn};

use super::Inner;
use super::store_call::bounded;
use crate::store::{
    ClaimOutcome, ClaimRequest, FencingToken, ForgetOutcome, RecordInfo, RecordState, RecordedStep,
    StoreError, Takeover, unsettled_intents,
};

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

/// What [`Idempotency::resolve_step`](super::Idempotency::resolve_step) did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResolveOutcome {
    /// The step's output is recorded: the next retry of the request resumes with it.
    Resolved,
    /// The record holds no call of that step with an unknown outcome (none made, or
    /// already settled), or is completed: nothing was written.
    NothingToResolve,
    /// A request is running under the record (its lease has not run out): nothing was
    /// written; resolve once it has stopped.
    Running {
        /// Until the holder's lease runs out, unless it renews it.
        lease_left: Duration,
    },
    /// There is no live record of the key.
    NotFound,
}

/// Records `output` as at-most-once step `name`'s output under the record of
/// `(scope, key)` (see [`Idempotency::resolve_step`](super::Idempotency::resolve_step)).
///
/// The operator's write goes through the protocol like a retry's: a claim of the same
/// request takes the stopped record over (its steps come back), the output is recorded
/// under that claim, and the claim is released, which keeps the record and its steps for
/// the request's next retry.
pub(super) async fn resolve_step(
    inner: &Inner,
    scope: &str,
    key: &str,
    name: &str,
    output: &serde_json::Value,
) -> Result<ResolveOutcome, StoreError> {
    let Some(info) = inspect(inner, scope, key).await? else {
        return Ok(ResolveOutcome::NotFound);
    };
    match info.state {
        RecordState::Completed { .. } => return Ok(ResolveOutcome::NothingToResolve),
        RecordState::InProgress {
            lease_expires_at,
            holder_alive: true,
        } => {
            let lease_left = lease_expires_at
                .duration_since(SystemTime::now())
                .unwrap_or_default();
            return Ok(ResolveOutcome::Running { lease_left });
        }
        RecordState::InProgress { .. } => {}
    }
    if !info.unknown_outcomes().contains(&name) {
        return Ok(ResolveOutcome::NothingToResolve);
    }
    let token = FencingToken::random();
    let life_left = info
        .expires_at
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    let claim = ClaimRequest {
        scope,
        key,
        fingerprint: &info.fingerprint,
        ttl: inner.default_ttl.max(life_left),
        lease: inner.default_lease,
        token,
    };
    let answer = bounded(inner.store_timeout, inner.store.claim(&claim)).await?;
    let steps = match answer.outcome {
        ClaimOutcome::Claimed {
            takeover: Some(Takeover::LeaseLost),
            steps,
            ..
        } => steps,
        // The record ended meanwhile and this claim made a new one: give it up.
        ClaimOutcome::Claimed { .. } => {
            bounded(inner.store_timeout, inner.store.release(scope, key, token)).await?;
            return Ok(ResolveOutcome::NotFound);
        }
        ClaimOutcome::InProgress { retry_after } => {
            return Ok(ResolveOutcome::Running {
                lease_left: retry_after,
            });
        }
        ClaimOutcome::Replay(_) | ClaimOutcome::Mismatch => {
            return Ok(ResolveOutcome::NothingToResolve);
        }
    };
    let settled = !unsettled_intents(&steps).contains(&name);
    if !settled {
        let step = RecordedStep {
            name: name.to_owned(),
            output: Bytes::from(output.to_string()),
            recorded_at: SystemTime::now(),
        };
        let record = inner.store.record_step(scope, key, token, &step);
        bounded(inner.store_timeout, record).await?;
    }
    // Releasing a record that holds steps keeps it, stopped, for the request's retry.
    bounded(inner.store_timeout, inner.store.release(scope, key, token)).await?;
    if settled {
        return Ok(ResolveOutcome::NothingToResolve);
    }
    info!(
        event = "step_resolved",
        scope,
        key,
        step = name,
        "an at-most-once step's unknown outcome resolved by an operator"
    );
    Ok(ResolveOutcome::Resolved)
}
