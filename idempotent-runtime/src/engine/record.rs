//! Recording a claimed request's outcome, or giving its claim up.
//!
//! A [`Verdict::Record`] is completed in the store: the plain path tries a few times
//! inline and then in the background ([`complete_with_retries`]), the transactional one
//! inside the handler's transaction ([`commit`]). Every way of giving up goes through
//! [`give_up`], which logs why and releases the claim so that a retry runs the handler
//! again.

use std::time::Duration;

use tokio::time::Instant;
use tracing::{Instrument, debug, error, info, warn};

use super::execution::Execution;
use super::heartbeat::with_heartbeat;
#[cfg(feature = "sql")]
use super::settlement::{Door, Settlement};
use super::store_call::store_call;
use crate::metrics::{self, Outcome, StoreOperation};
use crate::store::StoredResponse;

/// What the handler's answer means for the claim; `A` is the door's answer.
pub(super) enum Verdict<A> {
    /// Record this response and answer it.
    Record(Captured<A>),
    /// Release the claim (logging why) and answer this.
    GiveUp(GiveUp, A),
}

/// A finished request as recorded and as answered: the record a replay is rebuilt from,
/// and what this caller gets (for HTTP the same response, unless the body was not kept
/// whole).
pub(super) struct Captured<A> {
    pub(super) stored: StoredResponse,
    pub(super) answer: A,
}

/// How one attempt to record the response ended.
enum Completion {
    /// Recorded: replays answer it from now on. With the replay cache's time before the
    /// completion was sent, when this engine caches its own completions.
    Recorded(Option<i64>),
    /// The claim was taken over meanwhile: nothing to record, nothing left to do.
    NotOurs,
    /// The store failed: try again.
    Failed,
}

/// Why a claim is given up. Each has its own log line; all release the claim so that a
/// retry runs the handler again.
pub(super) enum GiveUp {
    /// The handler answered 5xx under `OnServerError::Release`.
    ServerError(http::StatusCode),
    #[cfg(feature = "sql")]
    /// A transactional handler returned `Err`.
    HandlerError(http::StatusCode),
    /// A function run through the typed entry point returned its error (a transactional
    /// one's writes rolled back).
    FunctionError,
    /// An extractor refused the request before the handler ran (behind the layer).
    Rejected(http::StatusCode),
    /// The handler panicked.
    Panic,
    #[cfg(feature = "sql")]
    /// A transactional handler ran past its maximum duration (its writes rolled back).
    TimedOut(Duration),
    /// The handler's transaction failed in the database (a failed statement left it
    /// aborted, or COMMIT refused it): `500 transaction_aborted`, not a store outage.
    #[cfg(feature = "sql")]
    Aborted {
        /// What the engine was doing.
        doing: &'static str,
        /// The database's error code, where it gave one.
        sqlstate: Option<String>,
        /// The database's message.
        error: String,
    },
    #[cfg(feature = "sql")]
    /// The store (or the handler's transaction) failed: the answer is `503`.
    Store {
        /// What the engine was doing.
        doing: &'static str,
        /// The error.
        error: String,
    },
}

impl GiveUp {
    /// What giving up counts as: the store's failure answered `503`, everything else a
    /// released claim.
    fn counted(&self) -> Outcome {
        #[cfg(feature = "sql")]
        if matches!(self, GiveUp::Store { .. }) {
            return Outcome::StoreError;
        }
        Outcome::Released
    }
}

/// Why a handler's transaction could not complete: an error the database answered with
/// (it has an SQLSTATE) is the transaction's own failure — a statement of the handler
/// failed and left it aborted, or COMMIT refused it — not a store outage; anything else
/// (a lost connection, a pool timeout) is.
#[cfg(feature = "sql")]
fn transaction_failure(doing: &'static str, err: &sqlx::Error) -> GiveUp {
    match err {
        sqlx::Error::Database(db) => GiveUp::Aborted {
            doing,
            sqlstate: db.code().map(|code| code.into_owned()),
            error: db.message().to_owned(),
        },
        _ => GiveUp::Store {
            doing,
            error: err.to_string(),
        },
    }
}

/// Tries to record the outcome a few times inline; if the store stays unreachable the
/// client gets its answer and the attempts go on in the background, so the claim is
/// completed as soon as the store is back (unless the lease was taken over meanwhile).
/// The lease is renewed all along.
///
/// `started` is a clock reading taken just before (the handler's finish): the retry
/// window and the first attempt's timeout count from it. `true` when the outcome was
/// recorded before this returned (not in the background, nor taken over meanwhile).
// Not an `async fn`, on purpose (see `protocol::execute`).
#[allow(clippy::manual_async_fn)]
pub(super) fn complete_with_retries(
    execution: Execution,
    stored: StoredResponse,
    started: Instant,
) -> impl Future<Output = bool> + Send {
    // An `async` block, not an `async fn`: see `protocol::execute`.
    async move {
        let deadline = started + execution.inner.completion_retry_window;
        // Inline, the client waits: a few quick attempts within about a second.
        let inline = with_heartbeat(&execution, async {
            for (attempt, delay_ms) in [25, 50, 100, 200].into_iter().enumerate() {
                let sent_at = match attempt {
                    0 => started,
                    _ => Instant::now(),
                };
                match try_complete(&execution, &stored, sent_at).await {
                    Completion::Failed => {}
                    done => return Some(done),
                }
                if attempt == 0 {
                    metrics::count(execution.config.name, Outcome::CompletionRetried);
                }
                if started.elapsed() > Duration::from_secs(1) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            }
            None
        })
        .await;
        if let Some(done) = inline {
            let recorded = matches!(done, Completion::Recorded(_));
            settle(&execution, done, stored);
            return recorded;
        }
        let span = tracing::Span::current();
        let tracker = execution.inner.tracker.clone();
        tracker.spawn(
            async move {
                // Short steps: once the store answers again, record before a retry can take
                // the key over.
                // Each renewal keeps the record a TTL past it: it ends a TTL after the last
                // grant.
                let ttl = execution.inner.ttl_for(&execution.config);
                let ttl_ends = || execution.lease_signal().granted_at() + ttl;
                let retries = async {
                    let mut said_still_trying = false;
                    let mut delay = Duration::from_millis(250);
                    loop {
                        match try_complete(&execution, &stored, Instant::now()).await
                        {
                            Completion::Failed => {}
                            done => return Some(done),
                        }
                        let next = Instant::now() + delay;
                        let stop = crate::lease::may_stop_recording(
                            next > deadline,
                            next > ttl_ends(),
                            execution.lease_signal().is_lost(),
                        );
                        if stop {
                            error!(
                                event = "store_error",
                                "gave up recording the response; the claim frees when its lease runs out"
                            );
                            return None;
                        }
                        if next > deadline && !said_still_trying {
                            said_still_trying = true;
                            metrics::count(execution.config.name, Outcome::CompletionOverdue);
                            error!(
                                event = "store_error",
                                "still recording the response past the completion retry window: \
                                 the store applies renewals but not the completion; retrying while the lease holds"
                            );
                        }
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(1));
                    }
                };
                if let Some(done) = with_heartbeat(&execution, retries).await {
                    settle(&execution, done, stored);
                }
            }
            .instrument(span),
        );
        false
    }
}

/// One attempt to record `stored`, sent at `sent_at` (its timeout counts from there).
async fn try_complete(
    execution: &Execution,
    stored: &StoredResponse,
    sent_at: Instant,
) -> Completion {
    let store = &execution.inner.store;
    let read_at = execution.cache_time();
    let completion = store.complete(
        execution.name.scope(),
        execution.name.key(),
        execution.token,
        stored,
    );
    let timeout = execution.inner.store_timeout;
    match store_call(StoreOperation::Complete, sent_at, timeout, completion).await {
        Ok(true) => {
            info!(
                event = "completed",
                status = stored.status,
                "response recorded"
            );
            Completion::Recorded(read_at)
        }
        Ok(false) => {
            warn!(
                event = "lease_lost",
                "lease was taken over before completion; response not recorded"
            );
            execution.count_lease_lost();
            Completion::NotOurs
        }
        Err(err) => {
            warn!(event = "store_error", error = %err, "recording the response failed; retrying");
            Completion::Failed
        }
    }
}

/// After the last attempt to record `stored`: a recorded response is cached.
fn settle(execution: &Execution, completion: Completion, stored: StoredResponse) {
    if let Completion::Recorded(read_at) = completion {
        execution.remember(stored, read_at);
    }
}

/// Logs why the claim is given up, releases it and answers `answer`.
pub(super) async fn give_up<A>(execution: &Execution, why: GiveUp, answer: A) -> A {
    metrics::count(execution.config.name, why.counted());
    match why {
        GiveUp::ServerError(status) => info!(
            event = "released",
            reason = "server_error",
            status = status.as_u16(),
            "handler answered a server error; releasing the claim"
        ),
        #[cfg(feature = "sql")]
        GiveUp::HandlerError(status) => info!(
            event = "released",
            reason = "handler_error",
            status = status.as_u16(),
            "handler returned an error; its writes rolled back"
        ),
        GiveUp::FunctionError => info!(
            event = "released",
            reason = "function_error",
            "the function returned an error; releasing the claim (a transactional one's \
             writes rolled back)"
        ),
        GiveUp::Rejected(status) => info!(
            event = "released",
            reason = "rejected",
            status = status.as_u16(),
            "an extractor refused the request before the handler ran; releasing the claim"
        ),
        GiveUp::Panic => error!(
            event = "released",
            reason = "panic",
            "handler panicked; releasing the claim"
        ),
        #[cfg(feature = "sql")]
        GiveUp::TimedOut(max) => error!(
            event = "released",
            reason = "max_duration",
            max_duration_ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX),
            "transactional handler ran past its maximum duration; rolled back"
        ),
        #[cfg(feature = "sql")]
        GiveUp::Aborted {
            doing,
            sqlstate,
            error,
        } => error!(
            event = "released",
            reason = "transaction_aborted",
            sqlstate = sqlstate.as_deref().unwrap_or("none"),
            error,
            "{doing} failed: the database refused the handler's transaction; rolled back"
        ),
        #[cfg(feature = "sql")]
        GiveUp::Store { doing, error } => error!(
            event = "store_error",
            error, "{doing} failed; releasing the claim"
        ),
    }
    release(execution).await;
    answer
}

/// Releases the claim (its token fences it: a retry that took the key over keeps it).
async fn release(execution: &Execution) {
    let store = &execution.inner.store;
    let release = store.release(
        execution.name.scope(),
        execution.name.key(),
        execution.token,
    );
    let timeout = execution.inner.store_timeout;
    let now = Instant::now();
    match store_call(StoreOperation::Release, now, timeout, release).await {
        Ok(true) => debug!(
            event = "released",
            "claim released; a retry runs the handler again"
        ),
        Ok(false) => warn!(
            event = "released",
            "claim was no longer ours to release (lease taken over)"
        ),
        Err(err) => {
            warn!(event = "store_error", error = %err, "releasing the claim failed; it frees when the lease runs out")
        }
    }
}

/// Completes the claim inside the handler's transaction and commits both.
#[cfg(feature = "sql")]
pub(super) async fn commit<DB: crate::transaction::TxDatabase, A: Door>(
    execution: &Execution,
    tx_store: &dyn crate::transaction::TxStore<DB>,
    mut tx: crate::transaction::Tx<DB>,
    captured: Captured<A>,
) -> A {
    let read_at = execution.cache_time();
    let completion = tx_store.complete_in(
        tx.conn(),
        execution.name.scope(),
        execution.name.key(),
        execution.token,
        &captured.stored,
    );
    let completed = metrics::timed(StoreOperation::Complete, completion).await;
    let failure = match completed {
        Ok(true) => match tx.into_inner().commit().await {
            Ok(()) => {
                info!(
                    event = "completed",
                    status = captured.stored.status,
                    "writes and response committed together"
                );
                execution.remember(captured.stored, read_at);
                execution.observe_duration(Instant::now());
                return captured.answer;
            }
            // A deferred constraint, a serialization failure: the database refused
            // the transaction at COMMIT. Nothing was written.
            Err(err) => transaction_failure("committing", &err),
        },
        Ok(false) => {
            let _ = tx.into_inner().rollback().await;
            warn!(
                event = "lease_lost",
                "lease was taken over; the handler's writes rolled back"
            );
            execution.count_lease_lost();
            return A::settle(Settlement::LeaseLost);
        }
        Err(err) => {
            let _ = tx.into_inner().rollback().await;
            match &err {
                // Typically Postgres' 25P02: a statement of the handler failed and
                // the transaction is aborted, so the completion cannot run in it.
                crate::store::StoreError::Database(db) => {
                    transaction_failure("recording the response", db)
                }
                _ => GiveUp::Store {
                    doing: "recording the response",
                    error: err.to_string(),
                },
            }
        }
    };
    let answer = match &failure {
        GiveUp::Aborted { .. } => A::settle(Settlement::TransactionAborted),
        _ => A::settle(Settlement::StoreUnavailable("recording the outcome")),
    };
    give_up(execution, failure, answer).await
}
