//! Waiting duplicates woken with `LISTEN/NOTIFY` ([`WatchClaims::watch_claim`] for
//! [`PostgresStore`](super::PostgresStore)).
//!
//! Migration 2's triggers notify the channel [`CHANNEL`] when an in-progress claim
//! completes or is released (migration 4: also a release that keeps the record for its
//! steps), with a compact payload ([`claim_id`]: a hash of scope and
//! key, never the raw key). One listener connection per store — lazily started on the
//! first wait, on a one-connection pool of its own, never one of the request pool's —
//! fans the notifications out to the waiters, each keeping the ids it watches.
//!
//! The listener can miss notifications while its connection is down. So: a lost
//! connection wakes every waiter (each claims again and the store's answer decides); until
//! `LISTEN` is back, waits fall back to the engine's bounded poll; and even while
//! listening, a waiter claims again at least every [`RECHECK`] in case a notification
//! went missing on a connection that died silently.
//!
//! [`WatchClaims::watch_claim`]: crate::store::WatchClaims::watch_claim

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::{broadcast, watch};
use tracing::{debug, warn};

use crate::store::ClaimWatch;

/// The channel migration 2's triggers notify.
pub(super) const CHANNEL: &str = "idempotent_claim_ended";

/// While listening, a waiter claims again at least this often: the bound on a
/// notification lost on a connection that died without the listener noticing.
const RECHECK: Duration = Duration::from_secs(2);

/// How long the listener waits before connecting again after a failure.
const RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// Notifications buffered for waiters that are slow to look; a waiter that falls behind
/// claims again (as after any wake-up).
const BUFFER: usize = 1024;

/// What the triggers send for a claim of `(scope, key)`: the first 32 hex digits of
/// SHA-256 over the scope, a zero byte (which Postgres text cannot contain) and the key.
pub(super) fn claim_id(scope: &str, key: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(scope.as_bytes());
    hasher.update([0]);
    hasher.update(key.as_bytes());
    let digest = hasher.finalize();
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// A wake-up from the listener: one claim ended, or `None`: anything may have (the
/// connection was lost, notifications may have been missed).
type Wake = Option<Arc<str>>;

/// The store's listener: started on the first wait, stopped when the store is dropped.
pub(super) struct Notifier {
    options: PgConnectOptions,
    shared: Arc<Shared>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[derive(Debug)]
struct Shared {
    /// `LISTEN` is active on a live connection.
    listening: watch::Sender<bool>,
    wakes: broadcast::Sender<Wake>,
}

impl std::fmt::Debug for Notifier {
    // Not the connect options: they hold the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("listening", &*self.shared.listening.borrow())
            .finish_non_exhaustive()
    }
}

impl Notifier {
    /// A notifier whose listener will connect with `options` (the store pool's).
    pub(super) fn new(options: PgConnectOptions) -> Self {
        Self {
            options,
            shared: Arc::new(Shared {
                listening: watch::Sender::new(false),
                wakes: broadcast::channel(BUFFER).0,
            }),
            task: Mutex::new(None),
        }
    }

    /// Resolves when the claim of `(scope, key)` may have ended: on its notification, on
    /// a lost listener connection or after [`RECHECK`] while listening; while not (yet)
    /// listening, after `poll` or as soon as the listener is up (the first wait starts it).
    pub(super) fn watch(&self, scope: &str, key: &str, poll: Duration) -> ClaimWatch {
        self.ensure_listener();
        // Subscribed before the flag is read: a listener that stops after this point
        // sends a wake-up this receiver gets.
        let mut wakes = self.shared.wakes.subscribe();
        let mut listening = self.shared.listening.subscribe();
        if !*listening.borrow_and_update() {
            return Box::pin(async move {
                tokio::select! {
                    () = tokio::time::sleep(poll) => {}
                    _ = listening.wait_for(|up| *up) => {}
                }
            });
        }
        let id = claim_id(scope, key);
        Box::pin(async move {
            let recheck = tokio::time::sleep(RECHECK);
            tokio::pin!(recheck);
            loop {
                tokio::select! {
                    wake = wakes.recv() => match wake {
                        Ok(Some(ended)) if *ended != *id => continue,
                        // Ours, everyone's, or missed (lagged, closed): claim again.
                        _ => return,
                    },
                    () = &mut recheck => return,
                }
            }
        })
    }

    /// Starts the listener task unless it runs (it ends when its runtime shuts down).
    fn ensure_listener(&self) {
        let mut task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if task.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let listener = listen(self.options.clone(), self.shared.clone());
        *task = Some(runtime.spawn(listener));
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut().unwrap_or_else(PoisonError::into_inner) {
            task.abort();
        }
    }
}

/// Marks the listener stopped (waking every waiter) when the listener task ends in any
/// way, including being dropped with its runtime.
struct Stopped(Arc<Shared>);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.listening.send_replace(false);
        let _ = self.0.wakes.send(None);
    }
}

/// The listener task: connects, `LISTEN`s and fans notifications out, reconnecting
/// after failures.
async fn listen(options: PgConnectOptions, shared: Arc<Shared>) {
    let stopped = Stopped(shared);
    let shared = &stopped.0;
    loop {
        match listen_once(&options, shared).await {
            Ok(()) => {}
            Err(err) => warn!(
                event = "store_error",
                error = %err,
                "listening for ended claims failed; waiting duplicates poll until it is back"
            ),
        }
        shared.listening.send_replace(false);
        let _ = shared.wakes.send(None);
        tokio::time::sleep(RECONNECT_DELAY).await;
    }
}

/// One listener connection, until it fails.
async fn listen_once(options: &PgConnectOptions, shared: &Shared) -> Result<(), sqlx::Error> {
    // A pool of one, only the listener's: sqlx's listener reconnects through it.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .max_lifetime(None)
        .idle_timeout(None)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(options.clone());
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(CHANNEL).await?;
    shared.listening.send_replace(true);
    debug!(
        event = "listening",
        channel = CHANNEL,
        "listening for ended claims"
    );
    loop {
        match listener.try_recv().await? {
            Some(notification) => {
                let _ = shared.wakes.send(Some(Arc::from(notification.payload())));
            }
            // The connection was lost and is back (LISTEN again included): what ended
            // in between is unknown, so every waiter claims again.
            None => {
                let _ = shared.wakes.send(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_ids_are_32_hex_digits_and_separate_scope_from_key() {
        let id = claim_id("acct", "order-1");
        assert_eq!(id.len(), 32);
        assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(claim_id("ab", "c"), claim_id("a", "bc"));
        assert_eq!(id, claim_id("acct", "order-1"));
    }
}
