//! What the protocol decided for a request, typed, before any door words it.
//!
//! The protocol ([`protocol`](super::protocol)) settles every request it does not run
//! as a [`Settlement`]: a replay, a key reused, a key in progress, a store outage, and so
//! on. A door (HTTP, or the typed entry point of [`function`](super::function)) turns a
//! settlement into its own answer through [`Door::settle`], and a handler's output into
//! a [`Verdict`](super::record::Verdict) through [`Judge`]: the decisions are made once,
//! here and in the protocol, and a door only says them in its own terms.

use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;

use super::answers;
use super::execution::Execution;
use super::record::Verdict;
use super::replay_cache::CachedReplay;
use crate::store::StoredResponse;

/// What the protocol answered for a request without (or after) running its handler.
pub(super) enum Settlement {
    /// The key's record completed with the request's fingerprint: replay it.
    Replayed(Replay),
    /// The key's record belongs to another request (another fingerprint).
    KeyReused,
    /// Another execution holds the key; retry after this long.
    InProgress(Duration),
    /// The store failed while the engine was doing this; the handler's work (if any
    /// began) was rolled back or never started, and the claim released.
    StoreUnavailable(&'static str),
    /// The scope came out empty: refused, never run unscoped.
    ScopeEmpty,
    /// A claim attempt panicked outside the handler, or the runtime shut down under it.
    AttemptInterrupted,
    /// The handler panicked; its claim was released.
    Panicked,
    /// The handler ran past its maximum duration; this record (an "interrupted" problem)
    /// was kept so that it never runs again under the key.
    Interrupted(StoredResponse),
    /// A transactional handler on an engine whose store is not of its database.
    #[cfg(feature = "sql")]
    TransactionUnsupported(&'static str),
    /// The handler's transaction failed in the database; nothing was written.
    #[cfg(feature = "sql")]
    TransactionAborted,
    /// The claim was taken over before the handler's transaction could commit; its
    /// writes were rolled back.
    #[cfg(feature = "sql")]
    LeaseLost,
    /// A transactional handler ran past its maximum duration; its writes rolled back.
    #[cfg(feature = "sql")]
    TimedOut,
}

/// A completed record to replay: from the replay cache, or as the store answered it.
pub(super) enum Replay {
    /// This process's cached copy.
    Cached(Arc<CachedReplay>),
    /// The store's answer.
    Stored(StoredResponse),
}

impl Replay {
    /// The record replayed.
    pub(super) fn into_stored(self) -> StoredResponse {
        match self {
            Self::Cached(cached) => cached.to_stored(),
            Self::Stored(stored) => stored,
        }
    }
}

/// A door's answers: what the caller gets for each [`Settlement`].
pub(super) trait Door: Send + Sized + 'static {
    /// The answer to a request the protocol settled.
    fn settle(settlement: Settlement) -> Self;

    /// The handler's own answer, when its record could not be confirmed before it is
    /// returned (the engine goes on recording it in the background). The default: the
    /// same answer (an HTTP client gets the response it would have got).
    fn record_pending(self) -> Self {
        self
    }
}

/// A handler's output: how the door judges it (record or give up) once it finished.
pub(super) trait Judge: Send + Sized + 'static {
    /// The door whose answers the verdict carries.
    type Answer: Door;

    /// Records or gives up, and with what answer.
    fn judge(self, execution: &Execution) -> impl Future<Output = Verdict<Self::Answer>> + Send;
}

impl Door for Response {
    fn settle(settlement: Settlement) -> Self {
        match settlement {
            Settlement::Replayed(Replay::Cached(cached)) => cached.response(),
            Settlement::Replayed(Replay::Stored(stored)) => answers::replay(stored),
            Settlement::KeyReused => answers::key_reused(),
            Settlement::InProgress(retry_after) => answers::in_progress(retry_after),
            Settlement::StoreUnavailable(_) => answers::store_unavailable(),
            Settlement::ScopeEmpty => answers::scope_empty(),
            Settlement::AttemptInterrupted => answers::internal_error(
                "The request was interrupted; it is safe to retry with the same key.",
            ),
            Settlement::Panicked => answers::handler_panicked(),
            Settlement::Interrupted(stored) => answers::stored_answer(stored),
            #[cfg(feature = "sql")]
            Settlement::TransactionUnsupported(database) => {
                answers::transaction_unsupported(database)
            }
            #[cfg(feature = "sql")]
            Settlement::TransactionAborted => answers::transaction_aborted(),
            #[cfg(feature = "sql")]
            Settlement::LeaseLost => answers::lease_lost(),
            #[cfg(feature = "sql")]
            Settlement::TimedOut => answers::internal_error(
                "The request ran longer than its maximum duration; its writes were rolled back. It is safe to retry with the same key.",
            ),
        }
    }
}
