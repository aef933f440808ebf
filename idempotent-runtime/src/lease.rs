//! The lease as the engine holds it: the licence rule, and [`LeaseSignal`], which tells a
//! running handler that its claim may no longer be its own.
//!
//! **Leases are the only licence to run.** The store counts a lease from the moment it
//! applied the claim or renewal, which is no earlier than the moment the engine sent it.
//! So the engine counts each lease from the send, on its own monotonic clock, and treats
//! it as ending a [`safety_margin`] early (the store's clock may run a little faster than
//! ours). A claim answered after that point is not run ([`licence_holds`]), and a running
//! handler's [`IdempotencyKey::lease_lost`](crate::key::IdempotencyKey::lease_lost) turns `true`
//! at that point even before the heartbeat notices.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// How much earlier than the store could the engine treat a lease as ended: a tenth of
/// it, for a store clock that runs faster than the engine's (and the time a handler takes
/// between checking the signal and its side effect).
pub(crate) fn safety_margin(lease: Duration) -> Duration {
    lease / 10
}

/// The licence rule: a lease granted by a call sent `elapsed` ago still licenses a run.
/// Every place that decides whether a claim may run (the claim's answer, the heartbeat,
/// `lease_lost`) asks this one function.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub fn licence_holds(elapsed: Duration, lease: Duration) -> bool {
    elapsed + safety_margin(lease) < lease
}

/// How long one renewal may take: the store timeout, but at most a third of the lease,
/// so that one stalled renewal still leaves time for the next before the licence ends.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub fn renewal_timeout(store_timeout: Duration, lease: Duration) -> Duration {
    store_timeout.min(lease / 3).max(Duration::from_millis(1))
}

/// Whether an engine may stop trying to record a finished handler's answer: only once
/// the record's TTL ended, or once the completion retry window passed *and* the lease is
/// lost. While the engine holds the lease the key is its own and a retry gets `409`;
/// giving up then would let the lease lapse and the handler run again.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub fn may_stop_recording(past_window: bool, past_ttl: bool, lease_lost: bool) -> bool {
    past_ttl || (past_window && lease_lost)
}

/// The request's lease as this engine holds it: when the last grant (the claim, or a
/// successful renewal) was sent, and whether the lease is known lost. Lost is sticky.
#[derive(Debug)]
pub(crate) struct LeaseSignal {
    lease: Duration,
    /// When the call behind the lease the store holds now was sent.
    granted_at: Mutex<Instant>,
    lost: AtomicBool,
    notify: Notify,
    /// Whether the loss was counted (`lease_lost`): once per request, however many
    /// places notice it.
    counted: AtomicBool,
}

impl LeaseSignal {
    /// A lease of `lease` granted by a claim sent at `sent_at`.
    pub(crate) fn new(sent_at: Instant, lease: Duration) -> Self {
        Self {
            lease,
            granted_at: Mutex::new(sent_at),
            lost: AtomicBool::new(false),
            notify: Notify::new(),
            counted: AtomicBool::new(false),
        }
    }

    /// A renewal sent at `sent_at` succeeded: the lease runs from there.
    pub(crate) fn renewed(&self, sent_at: Instant) {
        let mut granted = self.granted_at.lock().unwrap_or_else(|e| e.into_inner());
        *granted = (*granted).max(sent_at);
    }

    /// When the last grant was sent.
    pub(crate) fn granted_at(&self) -> Instant {
        *self.granted_at.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// From when on the lease no longer licenses a run ([`licence_holds`]).
    pub(crate) fn licence_ends(&self) -> Instant {
        self.granted_at() + (self.lease - safety_margin(self.lease))
    }

    /// Raises the signal and wakes every waiter.
    pub(crate) fn raise(&self) {
        self.lost.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Counts the request as `lease_lost` for `handler`, the first time only.
    pub(crate) fn count_loss_once(&self, handler: Option<&'static str>) {
        if !self.counted.swap(true, Ordering::SeqCst) {
            crate::metrics::count(handler, crate::metrics::Outcome::LeaseLost);
        }
    }

    /// Whether the signal was raised (the store said the claim is gone, or the heartbeat
    /// saw the licence end).
    pub(crate) fn is_raised(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Whether the lease no longer licenses a run: raised, or past its licence by the
    /// clock, whether or not the heartbeat has noticed yet.
    pub(crate) fn is_lost(&self) -> bool {
        self.is_raised()
            || !licence_holds(
                Instant::now().saturating_duration_since(self.granted_at()),
                self.lease,
            )
    }

    /// Completes once the lease is lost ([`is_lost`](Self::is_lost)).
    pub(crate) async fn lost(&self) {
        loop {
            // Registered before the check, so a raise in between is not missed.
            let notified = self.notify.notified();
            if self.is_lost() {
                return;
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(self.licence_ends()) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_licence_ends_a_margin_before_the_lease() {
        let lease = Duration::from_millis(1000);
        assert!(licence_holds(Duration::ZERO, lease));
        assert!(licence_holds(Duration::from_millis(899), lease));
        assert!(!licence_holds(Duration::from_millis(900), lease));
        assert!(!licence_holds(Duration::from_millis(1000), lease));
        assert!(!licence_holds(Duration::from_secs(60), lease));
    }
}
