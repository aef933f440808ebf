//! Running a claimed request's handler and capturing what it answered as a [`Verdict`]:
//! record it, or give the claim up. The plain run's sequence is in
//! [`protocol`](super::protocol); the transactional run, whose steps all happen inside
//! the handler's transaction, is here whole.

#[cfg(feature = "sql")]
use std::panic::AssertUnwindSafe;
#[cfg(feature = "sql")]
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
#[cfg(feature = "sql")]
use futures_util::FutureExt;
use tracing::{error, warn};

use super::answers::{self, stored_answer};
use super::capture::{BodyRead, read_capped, replayable_headers};
use super::execution::Execution;
use super::record::{Captured, GiveUp, Verdict};
#[cfg(feature = "sql")]
use super::record::{commit, give_up};
use super::settlement::{Door, Judge, Settlement};
use crate::config::OnServerError;
#[cfg(feature = "sql")]
use crate::key::IdempotencyKey;
#[cfg(feature = "sql")]
use crate::metrics;
use crate::steps::StepAnswer;
use crate::store::StoredResponse;
#[cfg(feature = "sql")]
use crate::transaction::{Tx, TxDatabase, TxStore};

/// A plain HTTP handler's response: a 5xx gives up under `OnServerError::Release`.
impl Judge for Response {
    type Answer = Response;

    fn judge(self, execution: &Execution) -> impl Future<Output = Verdict<Response>> + Send {
        let release_server_errors = execution.config.on_server_error == OnServerError::Release;
        capture(execution, self, release_server_errors)
    }
}

/// A transactional HTTP handler's result, made a response at once (its `T`/`E` need not
/// be `Send`): `Err` gives up, whatever its status; so does an `Ok` 5xx.
#[cfg(feature = "sql")]
impl Judge for Result<Response, Response> {
    type Answer = Response;

    async fn judge(self, execution: &Execution) -> Verdict<Response> {
        match self {
            Ok(answer) => capture(execution, answer, true).await,
            Err(answer) => Verdict::GiveUp(GiveUp::HandlerError(answer.status()), answer),
        }
    }
}

/// What the handler's response means for the claim: a 5xx (when
/// `release_server_errors`) gives up; anything else is recorded — its body only when
/// it fits the stored-response cap and ends before the maximum duration (see
/// [`super::capture`]).
async fn capture(
    execution: &Execution,
    response: Response,
    release_server_errors: bool,
) -> Verdict<Response> {
    let status = response.status();
    // The steps the handler ran decide before its status does (see `StepAnswer`).
    let release = match execution.steps.answer() {
        Some(StepAnswer::Release) if status.is_client_error() || status.is_server_error() => true,
        Some(StepAnswer::Record) => false,
        _ => release_server_errors && status.is_server_error(),
    };
    if release {
        return Verdict::GiveUp(GiveUp::ServerError(status), response);
    }
    if response
        .extensions()
        .get::<crate::rejection::ExtractorRejection>()
        .is_some()
    {
        return Verdict::GiveUp(GiveUp::Rejected(status), response);
    }
    let (parts, body) = response.into_parts();
    let cap = execution.inner.max_stored_body;
    let mut stored = StoredResponse {
        status: parts.status.as_u16(),
        headers: replayable_headers(&parts.headers, execution.config.excluded_headers),
        body: None,
    };
    let answer = match read_capped(body, cap, execution.deadline()).await {
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
            stored_answer(stored.clone())
        }
    };
    Verdict::Record(Captured { stored, answer })
}

/// The record of a plain handler that ran past its maximum duration: a `500` problem
/// saying it was interrupted, replayed to every retry.
pub(super) fn interrupted_record<A: Door>(execution: &Execution) -> Captured<A> {
    let max = execution.max_duration();
    error!(
        event = "completed",
        reason = "max_duration",
        max_duration_ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX),
        "handler ran past its maximum duration; recorded as interrupted"
    );
    let stored = answers::interrupted(max);
    let answer = A::settle(Settlement::Interrupted(stored.clone()));
    Captured { stored, answer }
}

/// Runs a transactional handler: its writes and the recorded response commit together;
/// a 5xx, an `Err`, a panic, a failure to begin or a run past the maximum duration rolls
/// back and gives the claim up.
#[cfg(feature = "sql")]
pub(super) async fn transact<DB, F, Fut, J>(
    execution: &Execution,
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
    let (transaction, _permit) = match crate::transaction::begin(tx_store.as_ref()).await {
        Ok(begun) => (begun.transaction, begun.permit),
        Err(err) => {
            let why = GiveUp::Store {
                doing: "beginning the transaction",
                error: err.to_string(),
            };
            let answer =
                J::Answer::settle(Settlement::StoreUnavailable("beginning the transaction"));
            return give_up(execution, why, answer).await;
        }
    };
    // A panic drops the handler's transaction, which rolls it back. The store may hold
    // it to less than the maximum duration (SQLite's write lock, see `max_hold`).
    let (deadline, max_duration) = match tx_store.max_hold() {
        Some(hold) if tokio::time::Instant::now() + hold < execution.deadline() => {
            (tokio::time::Instant::now() + hold, hold)
        }
        _ => (execution.deadline(), execution.max_duration()),
    };
    let started = std::time::Instant::now();
    let finished = AssertUnwindSafe(async {
        let running = handler(idempotency_key, Tx::new(transaction));
        // Past the maximum duration the handler is dropped with its transaction, which
        // rolls back: nothing was written, so a retry may run it again.
        let Ok((result, tx)) = tokio::time::timeout_at(deadline, running).await else {
            return Err(max_duration);
        };
        Ok((result.judge(execution).await, tx))
    })
    .catch_unwind()
    .await;
    metrics::handler_duration(execution.config.name, started.elapsed());
    match finished {
        Err(_panic) => {
            let answer = J::Answer::settle(Settlement::Panicked);
            give_up(execution, GiveUp::Panic, answer).await
        }
        Ok(Err(max_duration)) => {
            let answer = J::Answer::settle(Settlement::TimedOut);
            give_up(execution, GiveUp::TimedOut(max_duration), answer).await
        }
        Ok(Ok((Verdict::GiveUp(why, answer), tx))) => {
            if let Err(err) = tx.into_inner().rollback().await {
                warn!(error = %err, "rollback failed; the connection discards the transaction");
            }
            give_up(execution, why, answer).await
        }
        Ok(Ok((Verdict::Record(captured), tx))) => {
            commit(execution, tx_store.as_ref(), tx, captured).await
        }
    }
}
