//! Waiting instead of `409` ([`HandlerConfig::wait`]): a duplicate that finds the
//! original still running waits for its end, then claims again, and that claim's answer
//! decides — a replay, a run of its own (the original released its claim), or, at the
//! end of the wait, `409` + `Retry-After` as without waiting. The atomic claim stays the
//! only gate: waiting adds wake-ups, never a decision.
//!
//! Where the wake-up comes from:
//!
//! - the original runs in this engine: its [`Registration`] ends (dropped after the
//!   outcome is recorded or the claim released) and wakes every local waiter — a
//!   notification, no polling;
//! - elsewhere: the store's [`watch`](crate::store::Capabilities::watch) — `LISTEN`/
//!   `NOTIFY` on Postgres —, or on stores that offer none, a poll backed off from 20 ms
//!   to 500 ms.
//!
//! Which task waits: the request's own. Each claim attempt is uncancellable as
//! without waiting (a claim that wins executes there, out of the client's reach), and
//! hands the handler back when it finds the key still in progress; the wait itself holds
//! nothing (no pooled connection, no transaction, no tracked task), so a client that hangs
//! up while waiting leaves nothing behind.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::info;

use super::Inner;
use crate::config::HandlerConfig;
use crate::metrics;
use crate::sharded::{Id, Identified, Sharded, Table};
use crate::store::FencingToken;

/// The first poll step on a store without change notifications, doubled up to
/// [`MAX_POLL`].
const FIRST_POLL: Duration = Duration::from_millis(20);
/// The longest poll step.
const MAX_POLL: Duration = Duration::from_millis(500);

/// How one uncancellable claim attempt ended: answered, or the key still in progress
/// (with the handler handed back, for a request that waits and claims again). `A` is
/// the door's answer.
pub(super) enum Attempt<X, A> {
    /// Answered (replay, run, `422`, `503`, …): how, and the door's answer.
    Done(Settled, A),
    /// The key is still in progress: the store's `Retry-After`, and the handler back.
    InProgress(Duration, X),
}

/// How a claim attempt settled the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settled {
    /// The stored response was replayed.
    Replayed,
    /// This request claimed the key and ran the handler.
    Ran,
    /// The key belongs to another request (`422`).
    Mismatch,
    /// The store failed (`503`), or the attempt was interrupted.
    Failed,
}

impl Settled {
    fn as_str(self) -> &'static str {
        match self {
            Self::Replayed => "replayed",
            Self::Ran => "ran",
            Self::Mismatch => "mismatch",
            Self::Failed => "failed",
        }
    }
}

/// What a wait ended in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WaitOutcome {
    /// A claim after a wake-up settled it.
    Settled(Settled),
    /// The original was still running at the end of the wait: `409`.
    TimedOut,
}

/// Claims, and while the key is in progress, waits for a wake-up and claims again,
/// until `wait` has passed. `attempt` runs one claim (and the handler, if it wins)
/// uncancellably, handing the handler back when the key is in progress; so does this
/// when the key is still in progress at the end of the wait.
pub(super) async fn claim_waiting<X, T, Fut, A>(
    inner: &Inner,
    config: &HandlerConfig,
    scope: &str,
    key: &str,
    wait: Duration,
    mut execute: X,
    attempt: T,
) -> Attempt<X, A>
where
    T: Fn(X) -> Fut,
    Fut: Future<Output = Attempt<X, A>>,
{
    let started = Instant::now();
    let deadline = started + wait;
    let mut poll = FIRST_POLL;
    let mut waited = false;
    loop {
        // Before the claim, so that an end between the claim and the wait wakes it.
        let store_watch = inner.capabilities.watch_claim(scope, key, poll);
        let (retry_after, handler) = match attempt(execute).await {
            Attempt::Done(settled, response) => {
                if waited {
                    report(config, started, WaitOutcome::Settled(settled));
                }
                return Attempt::Done(settled, response);
            }
            Attempt::InProgress(retry_after, handler) => (retry_after, handler),
        };
        if Instant::now() >= deadline {
            report(config, started, WaitOutcome::TimedOut);
            return Attempt::InProgress(retry_after, handler);
        }
        execute = handler;
        waited = true;
        match inner.running.subscribe(scope, key) {
            // The original runs here: its end is a notification.
            Some(mut local) => {
                drop(store_watch);
                let _ = tokio::time::timeout_at(deadline, local.changed()).await;
            }
            None => {
                let _ = tokio::time::timeout_at(deadline, store_watch).await;
                poll = (poll * 2).min(MAX_POLL);
            }
        }
    }
}

/// The one place a wait's outcome is decided and reported.
fn report(config: &HandlerConfig, started: Instant, outcome: WaitOutcome) {
    let waited = started.elapsed();
    let waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
    let result = match outcome {
        WaitOutcome::Settled(settled) => settled.as_str(),
        WaitOutcome::TimedOut => "in_progress",
    };
    metrics::waited(config.name, result, waited);
    match outcome {
        WaitOutcome::Settled(_) => info!(
            event = "waited",
            result, waited_ms, "waited for the original request"
        ),
        WaitOutcome::TimedOut => info!(
            event = "waited",
            result, waited_ms, "the original request was still running at the end of the wait"
        ),
    }
}

/// The claims this engine is executing for handlers that have duplicates wait, by
/// `(scope, key)`: each entry's sender is dropped when the execution ends, which wakes
/// every local waiter.
#[derive(Debug)]
pub(super) struct Running {
    entries: Sharded<Table<Entry>>,
}

#[derive(Debug)]
struct Entry {
    id: Id,
    token: FencingToken,
    /// Never sent on: dropped when the execution ends, which ends every receiver's wait.
    ended: watch::Sender<()>,
}

impl Identified for Entry {
    fn id(&self) -> &Id {
        &self.id
    }
}

/// Shards, so that unrelated keys rarely share a lock.
const SHARDS: usize = 16;

impl Default for Running {
    fn default() -> Self {
        Self {
            entries: Sharded::new(SHARDS, Table::default),
        }
    }
}

impl Running {
    /// Records that this engine executes the claim `token` of `(scope, key)` until the
    /// returned registration is dropped. A claim taken over from a lost lease replaces
    /// the earlier one (whose waiters then wake and claim again).
    pub(super) fn register(
        self: &Arc<Self>,
        scope: &str,
        key: &str,
        token: FencingToken,
    ) -> Registration {
        let id = self.entries.id(scope, key);
        let (ended, _) = watch::channel(());
        let entry = Entry {
            id: Id::new(id),
            token,
            ended,
        };
        self.entries.lock(id).insert(entry);
        Registration {
            running: self.clone(),
            hash: id.hash(),
            token,
        }
    }

    /// A receiver whose `changed()` returns when the local execution of `(scope, key)`
    /// ends; `None` when this engine is not executing it.
    fn subscribe(&self, scope: &str, key: &str) -> Option<watch::Receiver<()>> {
        let id = self.entries.id(scope, key);
        self.entries
            .lock(id)
            .get(id)
            .map(|entry| entry.ended.subscribe())
    }
}

/// A running execution's entry in [`Running`]; dropping it wakes the local waiters.
#[derive(Debug)]
pub(super) struct Registration {
    running: Arc<Running>,
    /// Its id's hash, and its claim's token: together they find its entry (a token is
    /// one claim's), so the registration keeps no copy of the id.
    hash: u64,
    token: FencingToken,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut shard = self.running.entries.lock_hash(self.hash);
        // Only our own entry: a later claim of the key (after a takeover) keeps its own.
        if let Some(entry) = shard.find_entry(self.hash, |entry| entry.token == self.token) {
            entry.remove();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_registration_wakes_its_waiters_and_removes_only_its_own_entry() {
        let running = Arc::new(Running::default());
        assert!(running.subscribe("s", "k").is_none());
        let first = running.register("s", "k", FencingToken(1));
        let mut waiter = running.subscribe("s", "k").expect("registered");
        assert!(running.subscribe("sk", "").is_none());
        // A takeover's claim replaces the entry: the first claim's waiters wake.
        let second = running.register("s", "k", FencingToken(2));
        assert!(waiter.changed().await.is_err());
        drop(first);
        let mut waiter = running
            .subscribe("s", "k")
            .expect("the takeover's entry stays");
        drop(second);
        assert!(waiter.changed().await.is_err());
        assert!(running.subscribe("s", "k").is_none());
    }
}
