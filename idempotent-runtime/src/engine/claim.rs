//! The store claim: sent with the times the lease and the replay cache count from, and
//! given back when it was answered too late to run.

use tokio::time::Instant;
use tracing::warn;

use super::Inner;
use super::replay_cache::ReplayCache;
use super::store_call::{store_call, timed_store_call};
use crate::key::ScopedKey;
use crate::metrics::StoreOperation;
use crate::store::{ClaimAnswer, ClaimRequest, FencingToken, StoreError};

/// A claim as the store answered it.
pub(super) struct SentClaim {
    /// What the store decided, and how long a record it reports still lives.
    pub(super) answer: Result<ClaimAnswer, StoreError>,
    /// Before the claim was sent: the store's lease ends no earlier than this plus the
    /// lease.
    pub(super) sent_at: Instant,
    /// When the store answered.
    pub(super) answered_at: Instant,
    /// The replay cache's time before the claim was sent (0 without a cache): a record
    /// the store reports ends no earlier than this plus its life.
    pub(super) cache_now: i64,
}

/// Sends `claim` to the store, bounded by the store timeout.
pub(super) async fn send(inner: &Inner, claim: &ClaimRequest<'_>) -> SentClaim {
    let sent_at = Instant::now();
    let cache_now = inner.replay_cache.as_ref().map_or(0, ReplayCache::now);
    let claimed = timed_store_call(
        StoreOperation::Claim,
        sent_at,
        inner.store_timeout,
        inner.store.claim(claim),
    );
    let (answer, answered_at) = claimed.await;
    SentClaim {
        answer,
        sent_at,
        answered_at,
        cache_now,
    }
}

/// Releases a claim that came back too late to run (its token fences it: a retry
/// that took the key over meanwhile keeps it).
pub(super) async fn release_late(inner: &Inner, name: &ScopedKey, token: FencingToken) {
    let release = inner.store.release(name.scope(), name.key(), token);
    let now = Instant::now();
    match store_call(StoreOperation::Release, now, inner.store_timeout, release).await {
        Ok(_) => {}
        Err(err) => {
            warn!(event = "store_error", error = %err, "releasing a late claim failed; it frees when its lease runs out")
        }
    }
}
