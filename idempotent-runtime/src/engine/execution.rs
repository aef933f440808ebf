//! [`Execution`]: a claim this request won, and everything the run, the heartbeat and
//! the record need to know about it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Inner;
use super::waiting::Registration;
use crate::config::HandlerConfig;
use crate::fingerprint::Fingerprint;
use crate::key::ScopedKey;
use crate::lease::LeaseSignal;
use crate::steps::StepLog;
use crate::store::{FencingToken, StoredResponse};

/// One claimed request: the handler runs under it, the lease is renewed for it, and its
/// outcome is recorded or the claim released through it.
pub(super) struct Execution {
    pub(super) inner: Arc<Inner>,
    /// Wakes this engine's waiting duplicates when dropped, i.e. once the outcome is
    /// recorded or the claim released (`None`: the handler's duplicates do not wait).
    pub(super) _registration: Option<Registration>,
    pub(super) config: HandlerConfig,
    /// The claimed scope and key.
    pub(super) name: ScopedKey,
    /// The request's fingerprint, and until when (replay-cache time) its record lives
    /// at least once completed: the claim's send time plus its TTL.
    pub(super) fingerprint: Fingerprint,
    pub(super) lives_until: i64,
    pub(super) token: FencingToken,
    pub(super) lease: Duration,
    /// When the claim was sent: the store's lease ends no earlier than this plus the
    /// lease; how long the handler took (from here) feeds `Retry-After`.
    pub(super) claimed_at: Instant,
    /// When the store answered the claim: the handler's run is timed from here, so the
    /// clock is not read again as the handler starts.
    pub(super) claim_answered_at: Instant,
    /// The steps earlier executions of the request recorded, and this one's; and the
    /// lease as held (when its last grant was sent; raised when it is lost).
    pub(super) steps: Arc<StepLog>,
}

impl Execution {
    /// When this request must be finished: the claim plus the handler's maximum duration.
    pub(super) fn deadline(&self) -> Instant {
        self.claimed_at + self.max_duration()
    }

    /// The handler's maximum duration.
    pub(super) fn max_duration(&self) -> Duration {
        self.inner.max_duration_for(&self.config)
    }

    /// From when on the lease no longer licenses a run (see [`crate::lease`]).
    pub(super) fn lease_deadline(&self) -> Instant {
        self.lease_signal().licence_ends()
    }

    /// Counts this request as `lease_lost`, unless it already was (the heartbeat and the
    /// completion may both notice).
    pub(super) fn count_lease_lost(&self) {
        self.lease_signal().count_loss_once(self.config.name);
    }

    /// The lease as held.
    pub(super) fn lease_signal(&self) -> &LeaseSignal {
        self.steps.lease()
    }

    /// Feeds how long this handler took, from its claim until `finished`, into the
    /// engine's `Retry-After` estimate.
    pub(super) fn observe_duration(&self, finished: Instant) {
        let took = finished.saturating_duration_since(self.claimed_at);
        self.inner.durations.observe(self.config.name, took);
    }

    /// The replay cache's time now, when it keeps this engine's own completions: read
    /// before a completion is sent, it is when the cached copy's maximum age starts.
    pub(super) fn cache_time(&self) -> Option<i64> {
        let cache = self.inner.replay_cache.as_ref()?;
        cache.remembers_completions().then(|| cache.now())
    }

    /// Caches the record this request completed (the store confirmed it), when the
    /// cache takes completions.
    pub(super) fn remember(&self, stored: StoredResponse, read_at: Option<i64>) {
        let Some(read_at) = read_at else {
            return;
        };
        let _ = self.inner.remember(
            &self.name,
            self.fingerprint,
            stored,
            self.lives_until,
            read_at,
        );
    }
}
