//! [`StoreWrites`]: the store's own short writes in flight, so that a transactional
//! handler about to take SQLite's one write lock lets them go first.
//!
//! SQLite hands its write lock to whichever connection asks first once it is free, not
//! to the one that waited longest. A claim or completion that is waiting (inside the busy
//! timeout) while transactional handlers run one after another would lose to each next
//! `BEGIN IMMEDIATE`, and time out as `503` on a busy ledger. Transactions wait for this
//! count to drop to zero (for a bounded time) before they begin.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// How long a transaction lets the store's writes go first at most: a steady stream of
/// claims must not starve transactional handlers either.
const MAX_YIELD: Duration = Duration::from_secs(2);

/// The store's writes in flight.
#[derive(Debug, Default)]
pub(super) struct StoreWrites {
    in_flight: AtomicUsize,
    idle: Notify,
    /// Transactions between their turn and their `BEGIN IMMEDIATE`'s return.
    beginning: AtomicUsize,
    begun: Notify,
}

/// One write in flight, until dropped.
pub(super) struct StoreWrite(Arc<StoreWrites>);

/// One transaction beginning, until dropped.
pub(super) struct Beginning(Arc<StoreWrites>);

impl StoreWrites {
    /// Counts a write until the returned guard is dropped.
    pub(super) fn enter(self: &Arc<Self>) -> StoreWrite {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        StoreWrite(Arc::clone(self))
    }

    /// Waits until no write is in flight, at most [`MAX_YIELD`].
    pub(super) async fn let_them_go_first(&self) {
        wait_for_zero(&self.in_flight, &self.idle).await;
    }

    /// Counts a transaction beginning until the returned guard is dropped.
    pub(super) fn beginning(self: &Arc<Self>) -> Beginning {
        self.beginning.fetch_add(1, Ordering::SeqCst);
        Beginning(Arc::clone(self))
    }

    /// Waits until no transaction is beginning, at most [`MAX_YIELD`].
    pub(super) async fn let_transactions_begin(&self) {
        wait_for_zero(&self.beginning, &self.begun).await;
    }
}

/// Waits until `count` is zero (`zero` is notified when it drops to zero), at most
/// [`MAX_YIELD`].
async fn wait_for_zero(count: &AtomicUsize, zero: &Notify) {
    let deadline = tokio::time::Instant::now() + MAX_YIELD;
    loop {
        let notified = zero.notified();
        if count.load(Ordering::SeqCst) == 0 {
            return;
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return;
        }
    }
}

impl Drop for StoreWrite {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Drop for Beginning {
    fn drop(&mut self) {
        if self.0.beginning.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.begun.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_for_writes_in_flight_then_goes() {
        let writes = Arc::new(StoreWrites::default());
        let write = writes.enter();
        let mut waiter = tokio::spawn({
            let writes = writes.clone();
            async move { writes.let_them_go_first().await }
        });
        let early = tokio::time::timeout(Duration::from_millis(20), &mut waiter).await;
        assert!(early.is_err(), "a write is in flight");
        drop(write);
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("goes once idle")
            .unwrap();
        // Idle: no wait at all.
        tokio::time::timeout(Duration::from_millis(10), writes.let_them_go_first())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn the_writer_waits_for_a_beginning_transaction() {
        let writes = Arc::new(StoreWrites::default());
        let beginning = writes.beginning();
        let mut writer = tokio::spawn({
            let writes = writes.clone();
            async move { writes.let_transactions_begin().await }
        });
        let early = tokio::time::timeout(Duration::from_millis(20), &mut writer).await;
        assert!(early.is_err(), "a transaction is beginning");
        drop(beginning);
        tokio::time::timeout(Duration::from_secs(1), writer)
            .await
            .expect("goes once it began")
            .unwrap();
    }
}
