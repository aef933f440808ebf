//! [`Capabilities`]: what a [`Store`](super::Store) offers beyond its required
//! operations, in one value the engine reads once, when it is built.
//!
//! Each capability is optional and its absence has a meaning the engine handles: no clock
//! (the replay cache counts on a monotonic clock of its own), not in-process (the cache
//! keeps every completion), no transactions (transactional handlers are refused), no
//! watch (a waiting duplicate polls, backed off). A store states them in
//! [`Store::capabilities`](super::Store::capabilities); a decorator written on
//! [`Forward`](super::Forward) passes its inner store's on unchanged.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::tx_support::TxSupport;
use crate::clock::Clock;

/// What a store offers beyond its required operations, in one value the engine reads
/// once, when it is built. Each capability is optional, and each field says what its
/// absence means.
///
/// Built from [`Capabilities::none`] with the builder methods (the type is
/// `#[non_exhaustive]`, so a store outside this crate builds it that way too):
///
/// ```
/// use std::sync::Arc;
///
/// use idempotent_runtime::clock::ManualClock;
/// use idempotent_runtime::store::Capabilities;
///
/// let clock = Arc::new(ManualClock::new());
/// let offered = Capabilities::none().with_clock(clock).in_process();
/// assert!(offered.in_process && offered.clock.is_some());
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Capabilities {
    /// The clock the store decides expiry by, when it keeps time in this process (the
    /// memory and SQLite stores: the clock they were opened with). The engine's replay
    /// cache then counts its entries' lives on the same clock, so a test that moves the
    /// store's [`ManualClock`](crate::clock::ManualClock) past a TTL expires the cache's
    /// copy too. `None`: the store keeps time elsewhere (a database server), and the
    /// cache uses a monotonic clock.
    pub clock: Option<Arc<dyn Clock>>,
    /// The store keeps its records in this process's memory, so answering a replay costs
    /// it no I/O and no hand-off to another thread (the memory store). The replay cache
    /// then keeps only records the store replayed, not every completion: copying each
    /// fresh key's record into the cache would cost every request more than it saves the
    /// few keys that are replayed. An in-process store keeps time in this process, so it
    /// also gives its [`clock`](Self::clock) (the conformance suite checks it).
    pub in_process: bool,
    /// What transactional handlers (`Tx<DB>`) need from the store: a handle per database
    /// that begins the handler's transaction and records the response inside it. `None`:
    /// transactional handlers are refused.
    pub transactions: Option<TxSupport>,
    /// Change notifications for duplicates that wait instead of answering `409`
    /// ([`HandlerConfig::wait`](crate::config::HandlerConfig::wait)); `PostgresStore`
    /// offers `LISTEN/NOTIFY`. `None`: a waiting duplicate claims again on a poll the
    /// engine backs off.
    pub watch: Option<Arc<dyn WatchClaims>>,
}

impl Capabilities {
    /// No capability: what a store gives by default.
    pub fn none() -> Self {
        Self::default()
    }

    /// What a duplicate waiting on `(scope, key)` waits on: the store's change
    /// notifications ([`watch`](Self::watch)), or on a store that offers none, `poll`.
    pub fn watch_claim(&self, scope: &str, key: &str, poll: Duration) -> ClaimWatch {
        match &self.watch {
            Some(watch) => watch.watch_claim(scope, key, poll),
            None => Box::pin(tokio::time::sleep(poll)),
        }
    }

    /// With [`clock`](Self::clock).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// With [`in_process`](Self::in_process) set.
    pub fn in_process(mut self) -> Self {
        self.in_process = true;
        self
    }

    /// With [`transactions`](Self::transactions).
    pub fn with_transactions(mut self, transactions: TxSupport) -> Self {
        self.transactions = Some(transactions);
        self
    }

    /// With [`watch`](Self::watch).
    pub fn with_watch(mut self, watch: Arc<dyn WatchClaims>) -> Self {
        self.watch = Some(watch);
        self
    }
}

/// A store's change notifications: the end of an in-progress claim, for a duplicate that
/// waits for it ([`Capabilities::watch`]).
pub trait WatchClaims: Send + Sync + std::fmt::Debug + 'static {
    /// Starts watching `(scope, key)` for the end of its in-progress claim (completed or
    /// released).
    ///
    /// The engine calls it *before* the claim that may find the key in progress, and
    /// awaits the returned future only then: a store that subscribes to notifications
    /// must subscribe within this call, not when the future is first polled, so that a
    /// claim ending in between is not missed. The future resolves once the claim may
    /// have ended, or after `poll` when the store cannot tell (e.g. while its listener is
    /// not connected). Resolving early or for another key is allowed: the engine then
    /// claims again, and that claim's answer decides (replay, run, or wait on). It holds
    /// no pooled connection and no transaction while pending, and dropping it cancels
    /// the watch.
    fn watch_claim(&self, scope: &str, key: &str, poll: Duration) -> ClaimWatch;
}

/// What [`WatchClaims::watch_claim`] returns: resolves when a watched claim may have
/// ended.
pub type ClaimWatch = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;
