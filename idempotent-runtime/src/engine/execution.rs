//! One claimed request: the handler runs (detached), the lease is renewed meanwhile, and
//! the outcome is recorded — or released on a 5xx or panic.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, debug, error, info, warn};

#[cfg(feature = "sql")]
use super::answers::lease_lost;
use super::answers::{internal_error, store_unavailable};
use super::{DEFAULT_REPLAY_HEADERS, Idempotency, bounded};
use crate::config::{HandlerConfig, OnServerError};
use crate::extract::IdempotencyKey;
use crate::store::{FencingToken, StoredResponse};

/// One claimed request: runs the handler, renews the lease meanwhile, records or
/// releases the outcome.
pub(super) struct Execution {
    pub(super) engine: Idempotency,
    pub(super) config: HandlerConfig,
    pub(super) scope: String,
    pub(super) key: String,
    pub(super) token: FencingToken,
    pub(super) lease: Duration,
}

/// What to do with the claim once the handler finished.
enum Outcome {
    /// Record this response (status, headers, buffered body) and answer it.
    Record(http::response::Parts, bytes::Bytes),
    /// Release the claim and answer this.
    Release(Response),
}

impl Execution {
    pub(super) async fn execute(self, handler: impl Future<Output = Response> + Send) -> Response {
        let heartbeat = AbortOnDropHandle::new(tokio::spawn(self.heartbeat().in_current_span()));
        let outcome = AssertUnwindSafe(async {
            let response = handler.await;
            self.classify(response).await
        })
        .catch_unwind()
        .await;
        match outcome {
            // The heartbeat goes on until the outcome is recorded: a store outage after
            // the handler finished must not let the lease lapse while we retry.
            Ok(Outcome::Record(parts, body)) => self.record(parts, body, heartbeat).await,
            Ok(Outcome::Release(response)) => {
                heartbeat.abort();
                self.release().await;
                response
            }
            Err(_panic) => {
                heartbeat.abort();
                error!(
                    event = "released",
                    reason = "panic",
                    "handler panicked; claim released"
                );
                self.release().await;
                internal_error("the handler failed; it is safe to retry with the same key")
            }
        }
    }

    #[cfg(feature = "sql")]
    pub(super) async fn execute_in_transaction<DB, F, Fut, T, E>(
        self,
        tx_store: std::sync::Arc<dyn crate::transaction::TxStore<DB>>,
        idempotency_key: IdempotencyKey,
        handler: F,
    ) -> Response
    where
        DB: crate::transaction::TxDatabase,
        F: FnOnce(IdempotencyKey, crate::transaction::Tx<DB>) -> Fut + Send + 'static,
        Fut: Future<Output = (Result<T, E>, crate::transaction::Tx<DB>)> + Send + 'static,
        T: IntoResponse + 'static,
        E: IntoResponse + 'static,
    {
        use crate::transaction::{BEGIN_TIMEOUT, Tx};

        let heartbeat = AbortOnDropHandle::new(tokio::spawn(self.heartbeat().in_current_span()));
        let begun = tokio::time::timeout(BEGIN_TIMEOUT, tx_store.begin()).await;
        let transaction = match begun {
            Ok(Ok(transaction)) => transaction,
            Ok(Err(err)) => {
                heartbeat.abort();
                error!(event = "store_error", error = %err, "could not begin the transaction");
                self.release().await;
                return store_unavailable();
            }
            Err(_) => {
                heartbeat.abort();
                error!(
                    event = "store_error",
                    "timed out waiting for a connection to begin the transaction"
                );
                self.release().await;
                return store_unavailable();
            }
        };
        // The handler runs; a panic drops its transaction, which rolls back.
        let outcome = AssertUnwindSafe(async {
            // Into a response at once: `T`/`E` need not be `Send` across the awaits below.
            let (response, ok, tx) = match handler(idempotency_key, Tx::new(transaction)).await {
                (Ok(ok), tx) => (ok.into_response(), true, tx),
                (Err(err), tx) => (err.into_response(), false, tx),
            };
            if !ok || response.status().is_server_error() {
                return (Outcome::Release(response), tx);
            }
            let (parts, body) = response.into_parts();
            match axum::body::to_bytes(body, usize::MAX).await {
                Ok(bytes) => (Outcome::Record(parts, bytes), tx),
                Err(err) => {
                    error!(error = %err, "reading the handler's response body failed");
                    let answer = internal_error(
                        "the response could not be produced; it is safe to retry with the same key",
                    );
                    (Outcome::Release(answer), tx)
                }
            }
        })
        .catch_unwind()
        .await;
        let answer = match outcome {
            Err(_panic) => {
                error!(
                    event = "released",
                    reason = "panic",
                    "handler panicked; its writes rolled back, claim released"
                );
                self.release().await;
                internal_error("the handler failed; it is safe to retry with the same key")
            }
            Ok((Outcome::Release(response), tx)) => {
                if let Err(err) = tx.into_inner().rollback().await {
                    warn!(error = %err, "rollback failed; the connection discards the transaction");
                }
                self.release().await;
                response
            }
            Ok((Outcome::Record(parts, body), mut tx)) => {
                let stored = self.stored_response(&parts, &body);
                let completed = tx_store
                    .complete_in(tx.conn(), &self.scope, &self.key, self.token, &stored)
                    .await;
                match completed {
                    Ok(true) => match tx.into_inner().commit().await {
                        Ok(()) => {
                            info!(
                                event = "completed",
                                status = stored.status,
                                "writes and response committed together"
                            );
                            Response::from_parts(parts, Body::from(body))
                        }
                        Err(err) => {
                            error!(event = "store_error", error = %err, "commit failed; nothing was written");
                            self.release().await;
                            store_unavailable()
                        }
                    },
                    Ok(false) => {
                        let _ = tx.into_inner().rollback().await;
                        warn!(
                            event = "lease_lost",
                            "lease was taken over; the handler's writes rolled back"
                        );
                        lease_lost()
                    }
                    Err(err) => {
                        let _ = tx.into_inner().rollback().await;
                        error!(event = "store_error", error = %err, "recording the response failed; writes rolled back");
                        self.release().await;
                        store_unavailable()
                    }
                }
            }
        };
        heartbeat.abort();
        answer
    }

    /// The record of a response: status, replayable headers, body unless over the cap.
    fn stored_response(
        &self,
        parts: &http::response::Parts,
        body: &bytes::Bytes,
    ) -> StoredResponse {
        let kept = body.len() <= self.engine.inner.max_stored_body;
        if !kept {
            warn!(
                event = "completed",
                body_len = body.len(),
                cap = self.engine.inner.max_stored_body,
                "response body over the stored-response cap; replays will carry status and headers only"
            );
        }
        StoredResponse {
            status: parts.status.as_u16(),
            headers: replayable_headers(&parts.headers, self.config.replay_headers),
            body: kept.then(|| body.clone()),
        }
    }

    async fn classify(&self, response: Response) -> Outcome {
        let status = response.status();
        if status.is_server_error() && self.config.on_server_error == OnServerError::Release {
            return Outcome::Release(response);
        }
        let (parts, body) = response.into_parts();
        match axum::body::to_bytes(body, usize::MAX).await {
            Ok(bytes) => Outcome::Record(parts, bytes),
            Err(err) => {
                error!(error = %err, "reading the handler's response body failed");
                Outcome::Release(internal_error(
                    "the response could not be produced; it is safe to retry with the same key",
                ))
            }
        }
    }

    /// Renews the lease every third of it until aborted. Runs as its own task so a slow
    /// store never stalls the handler.
    fn heartbeat(&self) -> impl Future<Output = ()> + Send + 'static {
        let store = self.engine.inner.store.clone();
        let timeout = self.engine.inner.store_timeout;
        let (scope, key, token, lease) =
            (self.scope.clone(), self.key.clone(), self.token, self.lease);
        async move {
            let period = (lease / 3).max(Duration::from_millis(10));
            let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                match bounded(timeout, store.renew(&scope, &key, token, lease)).await {
                    Ok(true) => debug!(event = "renewed", "lease renewed"),
                    // Completed or released just now, or taken over: completion tells
                    // which (and warns with `lease_lost` when it was taken over).
                    Ok(false) => {
                        debug!(event = "renewed", "claim no longer held; heartbeat stops");
                        return;
                    }
                    Err(err) => {
                        warn!(event = "store_error", error = %err, "renewing the lease failed")
                    }
                }
            }
        }
    }

    /// One attempt to record `stored`; `true` when there is nothing left to do.
    async fn try_complete(&self, stored: &StoredResponse) -> bool {
        let store = &self.engine.inner.store;
        let completion = store.complete(&self.scope, &self.key, self.token, stored);
        match bounded(self.engine.inner.store_timeout, completion).await {
            Ok(true) => {
                info!(
                    event = "completed",
                    status = stored.status,
                    "response recorded"
                );
                true
            }
            Ok(false) => {
                warn!(
                    event = "lease_lost",
                    "lease was taken over before completion; response not recorded"
                );
                true
            }
            Err(err) => {
                warn!(event = "store_error", error = %err, "recording the response failed; retrying");
                false
            }
        }
    }

    async fn release(&self) {
        let store = &self.engine.inner.store;
        let release = store.release(&self.scope, &self.key, self.token);
        match bounded(self.engine.inner.store_timeout, release).await {
            Ok(true) => info!(
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

    async fn record(
        self,
        parts: http::response::Parts,
        body: bytes::Bytes,
        heartbeat: AbortOnDropHandle<()>,
    ) -> Response {
        let stored = StoredResponse {
            status: parts.status.as_u16(),
            headers: replayable_headers(&parts.headers, self.config.replay_headers),
            body: (body.len() <= self.engine.inner.max_stored_body).then(|| body.clone()),
        };
        if stored.body.is_none() {
            warn!(
                event = "completed",
                body_len = body.len(),
                cap = self.engine.inner.max_stored_body,
                "response body over the stored-response cap; replays will carry status and headers only"
            );
        }
        complete_with_retries(self, stored, heartbeat).await;
        Response::from_parts(parts, Body::from(body))
    }
}

/// Tries to record the outcome a few times inline; if the store stays unreachable the
/// client gets its answer and the attempts go on in the background, so the claim is
/// completed as soon as the store is back (unless the lease was taken over meanwhile).
async fn complete_with_retries(
    execution: Execution,
    stored: StoredResponse,
    heartbeat: AbortOnDropHandle<()>,
) {
    let started = tokio::time::Instant::now();
    let deadline = started + execution.engine.inner.completion_retry_window;
    // Inline, the client waits: a few quick attempts within about a second.
    for delay_ms in [25, 50, 100, 200] {
        if execution.try_complete(&stored).await {
            heartbeat.abort();
            return;
        }
        if started.elapsed() > Duration::from_secs(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    }
    let span = tracing::Span::current();
    let engine = execution.engine.clone();
    engine.spawn_tracked(
        async move {
            // Short steps: once the store answers again, record before a retry can take
            // the key over.
            let mut delay = Duration::from_millis(250);
            while !execution.try_complete(&stored).await {
                if tokio::time::Instant::now() + delay > deadline {
                    error!(
                        event = "store_error",
                        "gave up recording the response; the claim frees when its lease runs out"
                    );
                    break;
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            heartbeat.abort();
        }
        .instrument(span),
    );
}

/// The response headers to store: the defaults plus the handler's opt-ins, in order.
fn replayable_headers(headers: &http::HeaderMap, extra: &[&str]) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .filter(|(name, _)| {
            let name = name.as_str();
            DEFAULT_REPLAY_HEADERS.contains(&name)
                || extra.iter().any(|e| e.eq_ignore_ascii_case(name))
        })
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect()
}
