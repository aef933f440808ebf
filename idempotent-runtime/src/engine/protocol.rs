//! The protocol: the whole sequence an idempotent request goes through, top to bottom.
//!
//! 1. **Scope**: an empty scope is refused (`500`), never run unscoped.
//! 2. **Replay cache**: a completed record this process saw recently is replayed (or a
//!    reuse of its key with another request answered `422`) without a store round trip.
//! 3. **Fingerprint**: the request's bytes are hashed, and let go of before the claim.
//! 4. **Claim**: one atomic store call decides ([`Claim`]): replay, `422`, `503`, the
//!    key in progress, or won. A claim answered too late in its lease is given back.
//! 5. **Wait**: a duplicate whose handler (or engine) sets a wait claims again when the
//!    original ends, until its wait is over; otherwise, or then, `409` + `Retry-After`.
//! 6. **Run**: the won claim runs the handler, uncancellable and bounded by its maximum
//!    duration, while the **heartbeat** renews the lease.
//! 7. **Record or give up**: the handler's answer becomes a [`Verdict`]: recorded (with
//!    retries, the lease still renewed), or the claim released (5xx, panic, rejection).
//!
//! Every door goes through this one sequence: what it decides without running the
//! handler is a [`Settlement`], which the door words ([`Door`]: a `Response` for HTTP,
//! an [`Outcome`](super::Outcome) for the typed entry point); what the handler returns,
//! the door judges ([`Judge`]) into a [`Verdict`].

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use tracing::{Instrument, debug, error, info, info_span, warn};

use super::Inner;
use super::claim;
use super::execution::Execution;
use super::heartbeat::with_heartbeat;
use super::inline::Uncancellable;
use super::record::{self, Captured, GiveUp, Verdict};
use super::replay_cache::Cached;
use super::run::interrupted_record;
#[cfg(feature = "sql")]
use super::run::transact;
use super::settlement::{Door, Judge, Replay, Settlement};
use super::waiting::{self, Attempt, Settled};
use crate::clock::millis;
use crate::config::HandlerConfig;
use crate::fingerprint::{Fingerprint, RequestFingerprint};
use crate::key::{IdempotencyKey, ScopedKey};
use crate::lease::{LeaseSignal, licence_holds};
use crate::metrics::{self, Outcome};
use crate::steps::{StepContext, StepLog};
#[cfg(feature = "sql")]
use crate::store::Capabilities;
use crate::store::{ClaimOutcome, ClaimRequest, FencingToken, Takeover};
#[cfg(feature = "sql")]
use crate::transaction::{Tx, TxDatabase, TxStore};

/// What the claim decided for this request: the state the protocol matches on.
// Matched at once, never stored: boxing the execution would cost every claim an
// allocation for nothing.
#[allow(clippy::large_enum_variant)]
enum Claim {
    /// This request owns the key: run the handler under this execution.
    Won(Execution),
    /// Answered without running the handler: a replay, `422`, or `503`.
    Answered(Settled, Settlement),
    /// Another request holds the key; the store's time until its lease runs out.
    InProgress(Duration),
}

/// A plain handler's request (see [`Idempotency::run`](super::Idempotency::run)).
pub(super) async fn run<F, Fut, R>(
    inner: &Arc<Inner>,
    config: &HandlerConfig,
    scope: &str,
    key: &str,
    request: RequestFingerprint,
    handler: F,
) -> Response
where
    F: FnOnce(IdempotencyKey) -> Fut + Send + 'static,
    Fut: Future<Output = R> + Send + 'static,
    R: IntoResponse + 'static,
{
    let span = info_span!("idempotent", scope = %scope, key = %key);
    handle(inner, config, scope, key, request, |execution, key| {
        // Boxed: the engine's layers around it then move a pointer, not the handler's
        // whole future.
        execute::<Response>(
            execution,
            Box::pin(async move { handler(key).await.into_response() }),
        )
    })
    .instrument(span)
    .await
}

/// A transactional handler's request (see
/// [`Idempotency::run_in_transaction`](super::Idempotency::run_in_transaction)).
#[cfg(feature = "sql")]
pub(super) async fn run_in_transaction<DB, F, Fut, T, E>(
    inner: &Arc<Inner>,
    config: &HandlerConfig,
    scope: &str,
    key: &str,
    request: RequestFingerprint,
    handler: F,
) -> Response
where
    DB: TxDatabase,
    F: FnOnce(IdempotencyKey, Tx<DB>) -> Fut + Send + 'static,
    Fut: Future<Output = (Result<T, E>, Tx<DB>)> + Send + 'static,
    T: IntoResponse + 'static,
    E: IntoResponse + 'static,
{
    let span = info_span!("idempotent", scope = %scope, key = %key, transactional = true);
    async move {
        // Resolved once: the same handle begins the transaction and records in it.
        let Some(tx_store) = tx_store::<DB>(&inner.capabilities) else {
            error!(
                event = "store_error",
                database = DB::DATABASE_NAME,
                "transactional handler on an engine whose store is not of its database"
            );
            return Response::settle(Settlement::TransactionUnsupported(DB::DATABASE_NAME));
        };
        // The handler's `T`/`E` become responses at once: they need not be `Send`
        // across the awaits that record them.
        let handler = move |key, tx| async move {
            let (result, tx) = handler(key, tx).await;
            let result = result
                .map(IntoResponse::into_response)
                .map_err(IntoResponse::into_response);
            (result, tx)
        };
        handle(inner, config, scope, key, request, |execution, key| {
            execute_in_transaction(execution, tx_store, key, handler)
        })
        .await
    }
    .instrument(span)
    .await
}

/// A request that carries no key to a handler whose key is optional: the handler runs
/// in the request's own task, as an unprotected handler would.
pub(super) async fn run_unprotected<Fut, R>(config: &HandlerConfig, handler: Fut) -> Response
where
    Fut: Future<Output = R>,
    R: IntoResponse,
{
    // Every unprotected run passes here: the place to count them.
    metrics::count(config.name, Outcome::Unprotected);
    debug!(
        event = "unprotected",
        handler = config.name.unwrap_or("unnamed"),
        "no idempotency key; running the handler unprotected (key = optional)"
    );
    handler.await.into_response()
}

/// Steps 1 to 5: answers from the replay cache when it can; otherwise claims the key
/// (waiting, if the handler's duplicates wait) and, when claimed, runs `execute` — both
/// [`Uncancellable`]: a client that hangs up can cancel neither the claim halfway
/// (leaving a claim that nothing runs) nor the handler. `A` is the door's answer: what
/// the protocol settles, the door words ([`Door::settle`]).
pub(super) async fn handle<X, Fut, A>(
    inner: &Arc<Inner>,
    config: &HandlerConfig,
    scope: &str,
    key: &str,
    request: RequestFingerprint,
    execute: X,
) -> A
where
    X: FnOnce(Execution, IdempotencyKey) -> Fut + Send + 'static,
    Fut: Future<Output = A> + Send + 'static,
    A: Door,
{
    if scope.trim().is_empty() {
        // One key space for every caller whose scope came out empty (say, from
        // optional authentication) would replay one caller's answer to another.
        error!(
            event = "scope_empty",
            "the scope argument yielded an empty scope; refusing to run unscoped"
        );
        return A::settle(Settlement::ScopeEmpty);
    }
    if let Some(cache) = &inner.replay_cache {
        match cache.get(scope, key, &request) {
            Cached::Hit(cached) => {
                metrics::count(config.name, Outcome::Replayed);
                info!(
                    event = "replayed",
                    status = cached.status(),
                    cached = true,
                    "replaying stored response"
                );
                return A::settle(Settlement::Replayed(Replay::Cached(cached)));
            }
            Cached::Mismatch => {
                metrics::count(config.name, Outcome::Mismatch);
                info!(
                    event = "mismatch",
                    cached = true,
                    "key reused with a different request"
                );
                return A::settle(Settlement::KeyReused);
            }
            Cached::Miss => {}
        }
    }
    // This hold on the request's bytes ends before the claim (a round trip, for most
    // stores); the handler may hold its own.
    let fingerprint = request.get();
    drop(request);
    // One claim attempt (and the handler, when it wins), uncancellable: run in this
    // task, moved to a tracked task of its own if the client hangs up. The handler
    // comes back when the key is in progress, for a request that waits.
    let name = ScopedKey::new(scope, key);
    let attempt = |execute: X| {
        let (engine, config, name) = (inner.clone(), *config, name.clone());
        let work = async move {
            // The handler's future is built inside the match and awaited after it:
            // awaited inside, the claim's result and the execution moved out of it
            // would each keep their bytes in this future beside the one awaited.
            let run = match claim_key(&engine, &config, &name, &fingerprint).await {
                Claim::Won(execution) => {
                    let steps = execution.steps.clone();
                    let key = IdempotencyKey::claimed(name, fingerprint, steps);
                    execute(execution, key)
                }
                Claim::Answered(settled, settlement) => {
                    return Attempt::Done(settled, A::settle(settlement));
                }
                Claim::InProgress(retry_after) => {
                    return Attempt::InProgress(retry_after, execute);
                }
            };
            Attempt::Done(Settled::Ran, run.await)
        };
        Uncancellable::new(work, &inner.tracker, attempt_interrupted::<X, A>)
    };
    let attempted = match inner.wait_for(config) {
        None => attempt(execute).await,
        // Boxed: only handlers whose duplicates wait pay for its state in their
        // request's future.
        Some(wait) => {
            let waiting = waiting::claim_waiting(inner, config, scope, key, wait, execute, attempt);
            Box::pin(waiting).await
        }
    };
    match attempted {
        Attempt::Done(_, answer) => answer,
        Attempt::InProgress(retry_after, _) => in_progress(inner, config, retry_after),
    }
}

/// Step 4: claims the key and decides what the store's answer means for this request.
async fn claim_key(
    inner: &Arc<Inner>,
    config: &HandlerConfig,
    name: &ScopedKey,
    fingerprint: &Fingerprint,
) -> Claim {
    let (scope, key) = (name.scope(), name.key());
    let lease = inner.lease_for(config);
    let request = ClaimRequest {
        scope,
        key,
        fingerprint,
        ttl: inner.ttl_for(config),
        lease,
        token: FencingToken::random(),
    };
    let claimed = claim::send(inner, &request).await;
    let (outcome, expires_in) = match claimed.answer {
        Ok(answer) => (answer.outcome, answer.replay_lives_for),
        Err(err) => {
            error!(event = "store_error", error = %err, "idempotency store unavailable; handler not run");
            metrics::count(config.name, Outcome::StoreError);
            return Claim::Answered(
                Settled::Failed,
                Settlement::StoreUnavailable("claiming the key"),
            );
        }
    };
    // A `409` counts once, where it is answered: a waiting duplicate may find the key
    // in progress several times before it settles.
    if let Some(counted) = claim_metric(&outcome) {
        metrics::count(config.name, counted);
    }
    let cache_now = claimed.cache_now;
    match outcome {
        ClaimOutcome::Replay(stored) => {
            info!(
                event = "replayed",
                status = stored.status,
                "replaying stored response"
            );
            let replay = match expires_in {
                Some(life) => {
                    let lives_until = cache_now.saturating_add(millis(life));
                    match inner.remember(name, *fingerprint, stored, lives_until, cache_now) {
                        Ok(cached) => Replay::Cached(cached),
                        Err(stored) => Replay::Stored(stored),
                    }
                }
                None => Replay::Stored(stored),
            };
            Claim::Answered(Settled::Replayed, Settlement::Replayed(replay))
        }
        ClaimOutcome::InProgress { retry_after } => Claim::InProgress(retry_after),
        ClaimOutcome::Mismatch => {
            info!(event = "mismatch", "key reused with a different request");
            Claim::Answered(Settled::Mismatch, Settlement::KeyReused)
        }
        ClaimOutcome::Claimed {
            token,
            takeover,
            steps,
        } => {
            let (sent_at, answered_at) = (claimed.sent_at, claimed.answered_at);
            if !licence_holds(answered_at - sent_at, lease) {
                // The store may already have handed the key to a retry: running now
                // could run the operation twice. Give the claim back and say retry.
                warn!(
                    event = "claim_late",
                    waited_ms =
                        u64::try_from((answered_at - sent_at).as_millis()).unwrap_or(u64::MAX),
                    lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
                    "the claim was answered too late in its lease to run; releasing it"
                );
                metrics::count(config.name, Outcome::ClaimLate);
                claim::release_late(inner, name, token).await;
                return Claim::Answered(
                    Settled::Failed,
                    Settlement::StoreUnavailable("claiming the key (answered too late)"),
                );
            }
            match takeover {
                None => info!(event = "claimed", "running handler"),
                Some(Takeover::Expired) => info!(
                    event = "taken_over",
                    reason = Takeover::Expired.as_str(),
                    "took over an expired record of this key; running handler"
                ),
                // The store reports a record released with its steps kept (a 5xx, a
                // panic) like one whose owner stopped renewing it: both are in progress
                // with their lease ended. Say both, rather than suggest a crash.
                Some(Takeover::LeaseLost) => info!(
                    event = "taken_over",
                    reason = "lease_ended",
                    "took over this request's earlier execution, whose lease had ended: it \
                     was released (a 5xx or a panic, its recorded steps kept) or its owner \
                     stopped renewing it (crashed or stalled); running handler"
                ),
            }
            if let Some(last) = steps.last() {
                info!(
                    event = "resuming",
                    steps = steps.len(),
                    after_step = last.name.as_str(),
                    "an earlier execution of this request recorded steps; resuming after them"
                );
            }
            // Only handlers whose duplicates wait are tracked: nobody else listens.
            let registration = inner
                .wait_for(config)
                .map(|_| inner.running.register(scope, key, token));
            Claim::Won(Execution {
                inner: inner.clone(),
                _registration: registration,
                config: *config,
                name: name.clone(),
                fingerprint: *fingerprint,
                lives_until: cache_now.saturating_add(millis(request.ttl)),
                token,
                lease,
                claimed_at: sent_at,
                claim_answered_at: answered_at,
                steps: Arc::new(StepLog::new(
                    StepContext {
                        store: inner.store.clone(),
                        #[cfg(feature = "sql")]
                        transactions: inner.capabilities.transactions.clone(),
                        token,
                        lease: LeaseSignal::new(sent_at, lease),
                        handler: config.name,
                        store_timeout: inner.store_timeout,
                        max_output: inner.max_stored_body,
                    },
                    steps,
                )),
            })
        }
    }
}

/// Steps 6 and 7 for a plain handler: runs it while the heartbeat renews the lease, has
/// its door judge its output, then records the outcome or gives the claim up.
// Not an `async fn`, on purpose (see the comment in the body).
#[allow(clippy::manual_async_fn)]
pub(super) fn execute<J: Judge>(
    execution: Execution,
    handler: impl Future<Output = J> + Send,
) -> impl Future<Output = J::Answer> + Send {
    // An `async` block, not an `async fn`: an `async fn` keeps its by-value arguments
    // twice in its state (the argument and the local it is moved into), and this
    // future is part of every request's.
    async move {
        let started = execution.claim_answered_at;
        let ran = AssertUnwindSafe(async {
            match tokio::time::timeout_at(execution.deadline(), handler).await {
                Ok(output) => output.judge(&execution).await,
                // The side effect may or may not have happened: record that, so that a
                // retry cannot run it a second time.
                Err(_elapsed) => Verdict::Record(interrupted_record(&execution)),
            }
        })
        .catch_unwind();
        let verdict = with_heartbeat(&execution, ran)
            .await
            .unwrap_or_else(|_panic| {
                Verdict::GiveUp(GiveUp::Panic, J::Answer::settle(Settlement::Panicked))
            });
        let finished = tokio::time::Instant::now();
        metrics::handler_duration(execution.config.name, finished - started);
        match verdict {
            // The lease is renewed until the outcome is recorded: a store outage after
            // the handler finished must not let it lapse while we retry.
            Verdict::Record(Captured { stored, answer }) => {
                execution.observe_duration(finished);
                if record::complete_with_retries(execution, stored, finished).await {
                    answer
                } else {
                    answer.record_pending()
                }
            }
            Verdict::GiveUp(why, answer) => record::give_up(&execution, why, answer).await,
        }
    }
}

/// Steps 6 and 7 for a transactional handler: its writes and the recorded response
/// commit together, or it rolls back and gives the claim up (see [`transact`]);
/// the lease is renewed throughout.
#[cfg(feature = "sql")]
pub(super) async fn execute_in_transaction<DB, F, Fut, J>(
    execution: Execution,
    tx_store: Arc<dyn TxStore<DB>>,
    idempotency_key: IdempotencyKey,
    handler: F,
) -> J::Answer
where
    DB: TxDatabase,
    F: FnOnce(IdempotencyKey, Tx<DB>) -> Fut + Send + 'static,
    Fut: Future<Output = (J, Tx<DB>)> + Send + 'static,
    J: Judge,
{
    // Its writes commit with its response, all or nothing: there is nothing to resume.
    execution.steps.refuse_inside_transaction();
    let transacted = transact(&execution, tx_store, idempotency_key, handler);
    with_heartbeat(&execution, transacted).await
}

/// The `409` + `Retry-After` for a duplicate that finds the key still in progress
/// (the store's `retry_after`: until the holder's lease runs out).
fn in_progress<A: Door>(inner: &Inner, config: &HandlerConfig, retry_after: Duration) -> A {
    metrics::count(config.name, Outcome::InProgress);
    let retry_after = inner.durations.retry_after(config.name, retry_after);
    info!(
        event = "in_progress",
        retry_after_secs = retry_after.as_secs(),
        "original request still running"
    );
    A::settle(Settlement::InProgress(retry_after))
}

/// The `outcome` a claim's answer counts under; `None` for a key in progress, counted
/// by [`in_progress`] when the `409` is answered.
fn claim_metric(outcome: &ClaimOutcome) -> Option<Outcome> {
    match outcome {
        ClaimOutcome::Replay(_) => Some(Outcome::Replayed),
        ClaimOutcome::InProgress { .. } => None,
        ClaimOutcome::Mismatch => Some(Outcome::Mismatch),
        ClaimOutcome::Claimed { .. } => Some(Outcome::Claimed),
    }
}

/// What a claim attempt answers when it panicked outside the handler (which has its
/// own guard) or was cut off by the runtime shutting down.
fn attempt_interrupted<X, A: Door>() -> Attempt<X, A> {
    Attempt::Done(Settled::Failed, A::settle(Settlement::AttemptInterrupted))
}

/// The store's transactions on database `DB`, if it has them.
#[cfg(feature = "sql")]
pub(super) fn tx_store<DB: TxDatabase>(
    capabilities: &Capabilities,
) -> Option<Arc<dyn TxStore<DB>>> {
    capabilities.transactions.as_ref()?.for_database::<DB>()
}
