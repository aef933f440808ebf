//! One claimed request: the handler runs (uncancellable, in the request's task), the
//! lease is renewed alongside it, and the outcome is recorded — or the claim is released
//! on a 5xx, an error or a panic.
//!
//! Both paths, plain and transactional, go through the same three steps: [`capture`]
//! turns what the handler answered into an [`Outcome`]; a recorded outcome is completed
//! (the plain path with retries, the transactional one inside the handler's
//! transaction); every way of giving up goes through [`Execution::give_up`], which logs
//! why and releases the claim.
//!
//! [`capture`]: Execution::capture

use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
#[cfg(feature = "sql")]
use axum::response::IntoResponse;
use axum::response::Response;
use futures_util::FutureExt;
use tracing::{Instrument, debug, error, info, warn};

use super::answers::internal_error;
#[cfg(feature = "sql")]
use super::answers::store_unavailable;
use super::capture::{BodyRead, read_capped};
use super::{ByDeadline, Idempotency, NEVER_REPLAYED, store_call};
use crate::config::{HandlerConfig, OnServerError};
use crate::key::ScopedKey;
use crate::metrics::{self, Outcome as Counted, StoreOperation};
use crate::store::{FencingToken, StoredResponse};

/// One claimed request: runs the handler, renews the lease meanwhile, records or
/// releases the outcome.
pub(super) struct Execution {
    pub(super) engine: Idempotency,
    /// Wakes this engine's waiting duplicates when dropped, i.e. once the outcome is
    /// recorded or the claim released (`None`: the handler's duplicates do not wait).
    pub(super) _registration: Option<super::waiting::Registration>,
    pub(super) config: HandlerConfig,
    /// The claimed scope and key.
    pub(super) name: ScopedKey,
    /// The request's fingerprint, and until when (replay-cache time) its record lives
    /// at least once completed: the claim's send time plus its TTL.
    pub(super) fingerprint: crate::fingerprint::Fingerprint,
    pub(super) lives_until: i64,
    pub(super) token: FencingToken,
    pub(super) lease: Duration,
    /// When the claim was sent: the store's lease ends no earlier than this plus the
    /// lease; how long the handler took (from here) feeds `Retry-After`.
    pub(super) claimed_at: tokio::time::Instant,
    /// When the store answered the claim: the handler's run is timed from here (one
    /// clock read fewer per request than reading it again as the handler starts).
    pub(super) claim_answered_at: tokio::time::Instant,
    /// The lease as held: when its last grant was sent; raised when it is lost.
    pub(super) lease_signal: std::sync::Arc<crate::lease::LeaseSignal>,
}

/// What the handler's answer means for the claim.
enum Outcome {
    /// Record this response and answer it.
    Record(Captured),
    /// Release the claim (logging why) and answer this.
    GiveUp(GiveUp, Response),
}

/// A finished request as recorded and as answered: the record a replay is rebuilt from,
/// and the response this client gets (the same, unless the body was not kept whole).
struct Captured {
    stored: StoredResponse,
    answer: Response,
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
enum GiveUp {
    /// The handler answered 5xx under `OnServerError::Release`.
    ServerError(http::StatusCode),
    #[cfg(feature = "sql")]
    /// A transactional handler returned `Err`.
    HandlerError(http::StatusCode),
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
    fn counted(&self) -> Counted {
        #[cfg(feature = "sql")]
        if matches!(self, GiveUp::Store { .. }) {
            return Counted::StoreError;
        }
        Counted::Released
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

/// The answer to a panicking handler.
fn panicked() -> Response {
    internal_error("The handler failed; it is safe to retry with the same key.")
}

impl Execution {
    /// Runs a plain handler (its answer becomes the response).
    // Not an `async fn`, on purpose (see the comment in the body).
    #[allow(clippy::manual_async_fn)]
    pub(super) fn execute(
        self,
        handler: impl Future<Output = Response> + Send,
    ) -> impl Future<Output = Response> + Send {
        // An `async` block, not an `async fn`: an `async fn` keeps its by-value `self`
        // twice in its state (the argument and the local it is moved into), and this
        // future is part of every request's.
        async move {
            let release_server_errors = self.config.on_server_error == OnServerError::Release;
            let started = self.claim_answered_at;
            let run = AssertUnwindSafe(async {
                match ByDeadline::new(self.deadline(), handler).await {
                    Some(response) => self.capture(response, release_server_errors).await,
                    // The side effect may or may not have happened: record that, so that a
                    // retry cannot run it a second time.
                    None => Outcome::Record(self.interrupted()),
                }
            })
            .catch_unwind();
            let outcome = self
                .with_heartbeat(run)
                .await
                .unwrap_or_else(|_panic| Outcome::GiveUp(GiveUp::Panic, panicked()));
            let finished = tokio::time::Instant::now();
            metrics::handler_duration(self.config.name, finished - started);
            match outcome {
                // The lease is renewed until the outcome is recorded: a store outage after
                // the handler finished must not let it lapse while we retry.
                Outcome::Record(Captured { stored, answer }) => {
                    self.observe_duration(finished);
                    complete_with_retries(self, stored, finished).await;
                    answer
                }
                Outcome::GiveUp(why, answer) => self.give_up(why, answer).await,
            }
        }
    }

    /// Runs a transactional handler: its writes and the recorded response commit
    /// together; anything else rolls back and releases the claim. The lease is renewed
    /// throughout.
    #[cfg(feature = "sql")]
    pub(super) async fn execute_in_transaction<DB, F, Fut, T, E>(
        self,
        tx_store: std::sync::Arc<dyn crate::transaction::TxStore<DB>>,
        idempotency_key: crate::key::IdempotencyKey,
        handler: F,
    ) -> Response
    where
        DB: crate::transaction::TxDatabase,
        F: FnOnce(crate::key::IdempotencyKey, crate::transaction::Tx<DB>) -> Fut + Send + 'static,
        Fut: Future<Output = (Result<T, E>, crate::transaction::Tx<DB>)> + Send + 'static,
        T: IntoResponse + 'static,
        E: IntoResponse + 'static,
    {
        self.with_heartbeat(self.transact(tx_store, idempotency_key, handler))
            .await
    }

    /// [`execute_in_transaction`](Self::execute_in_transaction) without the heartbeat.
    #[cfg(feature = "sql")]
    async fn transact<DB, F, Fut, T, E>(
        &self,
        tx_store: std::sync::Arc<dyn crate::transaction::TxStore<DB>>,
        idempotency_key: crate::key::IdempotencyKey,
        handler: F,
    ) -> Response
    where
        DB: crate::transaction::TxDatabase,
        F: FnOnce(crate::key::IdempotencyKey, crate::transaction::Tx<DB>) -> Fut + Send + 'static,
        Fut: Future<Output = (Result<T, E>, crate::transaction::Tx<DB>)> + Send + 'static,
        T: IntoResponse + 'static,
        E: IntoResponse + 'static,
    {
        use crate::transaction::{BEGIN_TIMEOUT, Tx};

        let begin = async {
            // The store's bound on open transactions: wait for a permit holding nothing.
            let permit = match tx_store.concurrency() {
                Some(bound) => Some(bound.acquire_owned().await.map_err(|_| {
                    crate::StoreError::backend(std::io::Error::other("the store is closed"))
                })?),
                None => None,
            };
            tx_store
                .begin()
                .await
                .map(|transaction| (transaction, permit))
        };
        let (transaction, _permit) = match tokio::time::timeout(BEGIN_TIMEOUT, begin).await {
            Ok(Ok(transaction)) => transaction,
            failed => {
                let error = match failed {
                    Ok(Err(err)) => err.to_string(),
                    _ => format!("no connection within {BEGIN_TIMEOUT:?}"),
                };
                let why = GiveUp::Store {
                    doing: "beginning the transaction",
                    error,
                };
                return self.give_up(why, store_unavailable()).await;
            }
        };
        // A panic drops the handler's transaction, which rolls it back. The store may hold
        // it to less than the maximum duration (SQLite's write lock, see `max_hold`).
        let (deadline, max_duration) = match tx_store.max_hold() {
            Some(hold) if tokio::time::Instant::now() + hold < self.deadline() => {
                (tokio::time::Instant::now() + hold, hold)
            }
            _ => (self.deadline(), self.max_duration()),
        };
        let started = std::time::Instant::now();
        let finished = AssertUnwindSafe(async {
            let running = handler(idempotency_key, Tx::new(transaction));
            // Past the maximum duration the handler is dropped with its transaction, which
            // rolls back: nothing was written, so a retry may run it again.
            let Ok((result, tx)) = tokio::time::timeout_at(deadline, running).await else {
                return Err(max_duration);
            };
            // Into a response at once: `T`/`E` need not be `Send` across the awaits below.
            let result = result
                .map(IntoResponse::into_response)
                .map_err(IntoResponse::into_response);
            let outcome = match result {
                Ok(answer) => self.capture(answer, true).await,
                Err(answer) => Outcome::GiveUp(GiveUp::HandlerError(answer.status()), answer),
            };
            Ok((outcome, tx))
        })
        .catch_unwind()
        .await;
        metrics::handler_duration(self.config.name, started.elapsed());
        match finished {
            Err(_panic) => self.give_up(GiveUp::Panic, panicked()).await,
            Ok(Err(max_duration)) => {
                let answer = internal_error(
                    "The request ran longer than its maximum duration; its writes were rolled back. It is safe to retry with the same key.",
                );
                self.give_up(GiveUp::TimedOut(max_duration), answer).await
            }
            Ok(Ok((Outcome::GiveUp(why, answer), tx))) => {
                if let Err(err) = tx.into_inner().rollback().await {
                    warn!(error = %err, "rollback failed; the connection discards the transaction");
                }
                self.give_up(why, answer).await
            }
            Ok(Ok((Outcome::Record(captured), tx))) => {
                self.commit(tx_store.as_ref(), tx, captured).await
            }
        }
    }

    /// Completes the claim inside the handler's transaction and commits both.
    #[cfg(feature = "sql")]
    async fn commit<DB: crate::transaction::TxDatabase>(
        &self,
        tx_store: &dyn crate::transaction::TxStore<DB>,
        mut tx: crate::transaction::Tx<DB>,
        captured: Captured,
    ) -> Response {
        let read_at = self.cache_time();
        let completion = tx_store.complete_in(
            tx.conn(),
            self.name.scope(),
            self.name.key(),
            self.token,
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
                    self.remember(captured.stored, read_at);
                    self.observe_duration(tokio::time::Instant::now());
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
                self.count_lease_lost();
                return super::answers::lease_lost();
            }
            Err(err) => {
                let _ = tx.into_inner().rollback().await;
                match &err {
                    // Typically Postgres' 25P02: a statement of the handler failed and
                    // the transaction is aborted, so the completion cannot run in it.
                    crate::StoreError::Database(db) => {
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
            GiveUp::Aborted { .. } => super::answers::transaction_aborted(),
            _ => store_unavailable(),
        };
        self.give_up(failure, answer).await
    }

    /// What the handler's response means for the claim: a 5xx (when
    /// `release_server_errors`) gives up; anything else is recorded — its body only when
    /// it fits the stored-response cap and ends before the maximum duration (see
    /// [`capture`](super::capture)).
    async fn capture(&self, response: Response, release_server_errors: bool) -> Outcome {
        let status = response.status();
        if release_server_errors && status.is_server_error() {
            return Outcome::GiveUp(GiveUp::ServerError(status), response);
        }
        if response
            .extensions()
            .get::<crate::rejection::ExtractorRejection>()
            .is_some()
        {
            return Outcome::GiveUp(GiveUp::Rejected(status), response);
        }
        let (parts, body) = response.into_parts();
        let cap = self.engine.inner.max_stored_body;
        let mut stored = StoredResponse {
            status: parts.status.as_u16(),
            headers: replayable_headers(&parts.headers, self.config.excluded_headers),
            body: None,
        };
        let answer = match read_capped(body, cap, self.deadline()).await {
            BodyRead::Whole(bytes) => {
                stored.body = Some(bytes.clone());
                Response::from_parts(parts, Body::from(bytes))
            }
            BodyRead::Partial { reason, answer } => {
                warn!(
                    event = "completed",
                    reason = reason.as_str(),
                    cap,
                    "response body not kept whole (over the stored-response cap, or still \
                     streaming at the maximum duration); replays carry status and headers only"
                );
                let mut parts = parts;
                parts.headers.remove(http::header::CONTENT_LENGTH);
                Response::from_parts(parts, answer)
            }
            BodyRead::Failed(error) => {
                // After the handler answered: its side effect happened. Recorded without
                // a body, so a retry replays this instead of running it again.
                error!(
                    event = "completed",
                    reason = "body_failed",
                    error,
                    "the response body failed after the handler answered; recorded without it"
                );
                super::answers::stored_answer(stored.clone())
            }
        };
        Outcome::Record(Captured { stored, answer })
    }

    /// When this request must be finished: the claim plus the handler's maximum duration.
    fn deadline(&self) -> tokio::time::Instant {
        self.claimed_at + self.max_duration()
    }

    fn max_duration(&self) -> Duration {
        self.engine.max_duration_for(&self.config)
    }

    /// The record of a plain handler that ran past its maximum duration: a `500` problem
    /// saying it was interrupted, replayed to every retry.
    fn interrupted(&self) -> Captured {
        let max = self.max_duration();
        error!(
            event = "completed",
            reason = "max_duration",
            max_duration_ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX),
            "handler ran past its maximum duration; recorded as interrupted"
        );
        let stored = super::answers::interrupted(max);
        let answer = super::answers::stored_answer(stored.clone());
        Captured { stored, answer }
    }

    /// Logs why the claim is given up, releases it and answers `answer`.
    async fn give_up(&self, why: GiveUp, answer: Response) -> Response {
        metrics::count(self.config.name, why.counted());
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
        self.release().await;
        answer
    }

    /// Counts this request as `lease_lost`, unless it already was (the heartbeat and the
    /// completion may both notice).
    fn count_lease_lost(&self) {
        self.lease_signal.count_loss_once(self.config.name);
    }

    /// Caches the record this request completed (the store confirmed it), when the
    /// cache takes completions.
    fn remember(&self, stored: StoredResponse, read_at: Option<i64>) {
        let Some(read_at) = read_at else {
            return;
        };
        let _ = self.engine.remember(
            &self.name,
            self.fingerprint,
            stored,
            self.lives_until,
            read_at,
        );
    }

    /// The replay cache's time now, when it keeps this engine's own completions: read
    /// before a completion is sent, it is when the cached copy's maximum age starts.
    fn cache_time(&self) -> Option<i64> {
        let cache = self.engine.inner.replay_cache.as_ref()?;
        cache.remembers_completions().then(|| cache.now())
    }

    /// Feeds how long this handler took, from its claim until `finished`, into the
    /// engine's `Retry-After` estimate.
    fn observe_duration(&self, finished: tokio::time::Instant) {
        let took = finished.saturating_duration_since(self.claimed_at);
        self.engine.inner.durations.observe(self.config.name, took);
    }

    /// Runs `work` while renewing the lease alongside it, in the same task: no task is
    /// spawned per request, and a slow renewal never stalls `work` (both are polled
    /// whenever the task wakes). The heartbeat is only built once `work` has to wait: a
    /// handler that answers at its first poll costs no timer and no allocation.
    fn with_heartbeat<W: Future>(&self, work: W) -> WithHeartbeat<'_, W> {
        WithHeartbeat {
            work,
            execution: self,
            heartbeat: Heartbeat::NotStarted,
        }
    }

    /// Renews the lease every third of it, counted from the claim or the last successful
    /// renewal (so a heartbeat built late, or restarted for the completion retries, keeps
    /// the schedule); ends when the store says the claim is no longer held. Until the
    /// first renewal is due it holds one timer.
    ///
    /// Raises the lease signal (the handler sees [`IdempotencyKey::lease_lost`]) when
    /// the store says the claim was taken over, or when the licence ends with no renewal
    /// since ([`crate::lease::licence_holds`], counted from before the last successful
    /// renewal or the claim was sent), so the signal is raised before the store could
    /// hand the key to a retry. That deadline lives in the lease signal, so a heartbeat
    /// restarted in the background (completion retries) keeps it.
    ///
    /// [`IdempotencyKey::lease_lost`]: crate::IdempotencyKey::lease_lost
    async fn heartbeat(&self) {
        let period = (self.lease / 3).max(Duration::from_millis(10));
        let first_tick = self.lease_signal.granted_at() + period;
        // One timer until the first renewal is due (or the licence ends first).
        tokio::time::sleep_until(first_tick.min(self.lease_deadline())).await;
        self.renew_until_released(first_tick, period).await;
    }

    /// From when on the lease no longer licenses a run (see [`crate::lease`]).
    fn lease_deadline(&self) -> tokio::time::Instant {
        self.lease_signal.licence_ends()
    }

    /// The heartbeat's renewal loop, from the first tick on.
    async fn renew_until_released(&self, first_tick: tokio::time::Instant, period: Duration) {
        let store = &self.engine.inner.store;
        let renew_timeout =
            crate::lease::renewal_timeout(self.engine.inner.store_timeout, self.lease);
        let (scope, key) = (self.name.scope(), self.name.key());
        let (token, lease) = (self.token, self.lease);
        let signal = &self.lease_signal;
        let deadline = || self.lease_deadline();
        let lose = || {
            if !signal.is_raised() {
                warn!(
                    event = "lease_lost",
                    "no lease renewal succeeded for (nearly) a whole lease; a retry may take the key over"
                );
                signal.raise();
                signal.count_loss_once(self.config.name);
            }
        };
        let mut ticker = tokio::time::interval_at(first_tick, period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(deadline()), if !signal.is_raised() => {
                    lose();
                    continue;
                }
                _ = ticker.tick() => {}
            }
            let sent_at = tokio::time::Instant::now();
            let renewal = store.renew(scope, key, token, lease);
            let renewal = store_call(StoreOperation::Renew, sent_at, renew_timeout, renewal);
            let renewed = tokio::select! {
                renewed = renewal => renewed,
                () = tokio::time::sleep_until(deadline()), if !signal.is_raised() => {
                    lose();
                    continue;
                }
            };
            match renewed {
                Ok(true) => {
                    debug!(event = "renewed", "lease renewed");
                    signal.renewed(sent_at);
                }
                // Completed or released just now, or taken over: completion tells
                // which (and warns with `lease_lost` when it was taken over).
                Ok(false) => {
                    debug!(event = "renewed", "claim no longer held; heartbeat stops");
                    signal.raise();
                    return;
                }
                Err(err) => {
                    warn!(event = "store_error", error = %err, "renewing the lease failed")
                }
            }
        }
    }

    /// One attempt to record `stored`, sent at `sent_at` (its timeout counts from there).
    async fn try_complete(
        &self,
        stored: &StoredResponse,
        sent_at: tokio::time::Instant,
    ) -> Completion {
        let store = &self.engine.inner.store;
        let read_at = self.cache_time();
        let completion = store.complete(self.name.scope(), self.name.key(), self.token, stored);
        let timeout = self.engine.inner.store_timeout;
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
                self.count_lease_lost();
                Completion::NotOurs
            }
            Err(err) => {
                warn!(event = "store_error", error = %err, "recording the response failed; retrying");
                Completion::Failed
            }
        }
    }

    /// After the last attempt to record `stored`: a recorded response is cached.
    fn settle(&self, completion: Completion, stored: StoredResponse) {
        if let Completion::Recorded(read_at) = completion {
            self.remember(stored, read_at);
        }
    }

    async fn release(&self) {
        let store = &self.engine.inner.store;
        let release = store.release(self.name.scope(), self.name.key(), self.token);
        let timeout = self.engine.inner.store_timeout;
        let now = tokio::time::Instant::now();
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
}

pin_project_lite::pin_project! {
    /// `work` with the lease renewed alongside it; see [`Execution::with_heartbeat`].
    struct WithHeartbeat<'a, W> {
        #[pin]
        work: W,
        execution: &'a Execution,
        heartbeat: Heartbeat<'a>,
    }
}

/// The heartbeat of a [`WithHeartbeat`].
enum Heartbeat<'a> {
    /// `work` has not had to wait yet.
    NotStarted,
    /// Renewing (boxed: most requests never get here, so their futures stay small).
    Running(Pin<Box<dyn Future<Output = ()> + Send + 'a>>),
    /// The claim is no longer held (completed, released or taken over): nothing left to
    /// renew.
    Ended,
}

impl<W: Future> Future for WithHeartbeat<'_, W> {
    type Output = W::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<W::Output> {
        let this = self.project();
        if let Poll::Ready(done) = this.work.poll(cx) {
            return Poll::Ready(done);
        }
        if let Heartbeat::NotStarted = this.heartbeat {
            *this.heartbeat = Heartbeat::Running(Box::pin(this.execution.heartbeat()));
        }
        if let Heartbeat::Running(heartbeat) = this.heartbeat
            && heartbeat.as_mut().poll(cx).is_ready()
        {
            *this.heartbeat = Heartbeat::Ended;
        }
        Poll::Pending
    }
}

/// Tries to record the outcome a few times inline; if the store stays unreachable the
/// client gets its answer and the attempts go on in the background, so the claim is
/// completed as soon as the store is back (unless the lease was taken over meanwhile).
/// The lease is renewed all along.
///
/// `started` is a clock reading taken just before (the handler's finish): the retry
/// window and the first attempt's timeout count from it.
// Not an `async fn`, on purpose (see `Execution::execute`).
#[allow(clippy::manual_async_fn)]
fn complete_with_retries(
    execution: Execution,
    stored: StoredResponse,
    started: tokio::time::Instant,
) -> impl Future<Output = ()> + Send {
    // An `async` block, not an `async fn`: see `Execution::execute`.
    async move {
        let deadline = started + execution.engine.inner.completion_retry_window;
        // Inline, the client waits: a few quick attempts within about a second.
        let inline = execution
            .with_heartbeat(async {
                for (attempt, delay_ms) in [25, 50, 100, 200].into_iter().enumerate() {
                    let sent_at = match attempt {
                        0 => started,
                        _ => tokio::time::Instant::now(),
                    };
                    match execution.try_complete(&stored, sent_at).await {
                        Completion::Failed => {}
                        done => return Some(done),
                    }
                    if attempt == 0 {
                        metrics::count(execution.config.name, Counted::CompletionRetried);
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
            execution.settle(done, stored);
            return;
        }
        let span = tracing::Span::current();
        let engine = execution.engine.clone();
        engine.spawn_tracked(
            async move {
                // Short steps: once the store answers again, record before a retry can take
                // the key over.
                let ttl_ends = execution.claimed_at + execution.engine.ttl_for(&execution.config);
                let retries = async {
                    let mut said_still_trying = false;
                    let mut delay = Duration::from_millis(250);
                    loop {
                        match execution
                            .try_complete(&stored, tokio::time::Instant::now())
                            .await
                        {
                            Completion::Failed => {}
                            done => return Some(done),
                        }
                        let next = tokio::time::Instant::now() + delay;
                        let stop = crate::lease::may_stop_recording(
                            next > deadline,
                            next > ttl_ends,
                            execution.lease_signal.is_lost(),
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
                            metrics::count(execution.config.name, Counted::CompletionOverdue);
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
                if let Some(done) = execution.with_heartbeat(retries).await {
                    execution.settle(done, stored);
                }
            }
            .instrument(span),
        );
    }
}

/// The response headers to store, in order: every one but those never replayed, those
/// a `Connection` field names, and the handler's exclusions.
fn replayable_headers(headers: &http::HeaderMap, excluded: &[&str]) -> Vec<(String, Vec<u8>)> {
    let connection_scoped: Vec<String> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    headers
        .iter()
        .filter(|(name, _)| {
            let name = name.as_str();
            !NEVER_REPLAYED.contains(&name)
                && !connection_scoped.iter().any(|scoped| scoped == name)
                && !excluded.iter().any(|e| e.eq_ignore_ascii_case(name))
        })
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect()
}
