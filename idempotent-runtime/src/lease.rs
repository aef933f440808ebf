//! [`LeaseSignal`]: tells a running handler that its claim may no longer be its own.
//!
//! The engine renews a running request's lease every third of it. When renewals keep
//! failing (the store stalls) until the lease has run out, or the store says the claim
//! was taken over, another request may now run the same operation: the handler should
//! stop before its side effect. The engine raises the signal; the handler reads it
//! through [`IdempotencyKey::lease_lost`](crate::IdempotencyKey::lease_lost).

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// Set once, when the request's lease is lost; never cleared.
#[derive(Debug, Default)]
pub(crate) struct LeaseSignal {
    lost: AtomicBool,
    notify: Notify,
    /// Whether the loss was counted (`lease_lost`): once per request, however many
    /// places notice it.
    counted: AtomicBool,
}

impl LeaseSignal {
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

    /// Whether the signal was raised.
    pub(crate) fn is_raised(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Completes once the signal is raised.
    pub(crate) async fn raised(&self) {
        loop {
            // Registered before the check, so a raise in between is not missed.
            let notified = self.notify.notified();
            if self.is_raised() {
                return;
            }
            notified.await;
        }
    }
}
