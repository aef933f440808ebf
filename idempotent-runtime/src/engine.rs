//! [`Idempotency`]: the claim → execute → record loop every idempotent request runs.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use http::{HeaderName, HeaderValue, StatusCode, header};
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::config::{HandlerConfig, OnServerError};
use crate::extract::IdempotencyKey;
use crate::fingerprint::Fingerprint;
use crate::problem::{Problem, codes};
use crate::store::{ClaimOutcome, ClaimRequest, FencingToken, Store, StoredResponse};

/// The header marking a replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// Response headers always stored and replayed. Everything else is per-request (`Date`,
/// trace ids, `Set-Cookie`, …) unless a handler opts in with `replay_headers`.
pub const DEFAULT_REPLAY_HEADERS: [&str; 5] = [
    "content-type",
    "location",
    "etag",
    "last-modified",
    "content-location",
];

/// Default TTL: Stripe's 24 hours.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Default lease: 30 seconds, renewed every third of it while the handler runs.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default cap on a stored response body: 1 MiB.
pub const DEFAULT_MAX_STORED_BODY: usize = 1024 * 1024;

/// The idempotency engine: one per application, cheap to clone (an `Arc` inside). Put
/// it in the router state and implement `FromRef` so the `#[idempotent]` handlers find
/// it.
///
/// ```
/// use idempotent_runtime::{Idempotency, store::MemoryStore};
/// let engine = Idempotency::new(MemoryStore::new());
/// assert_eq!(engine.header_name().as_str(), "idempotency-key");
/// ```
#[derive(Clone, Debug)]
pub struct Idempotency {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn Store>,
    default_ttl: Duration,
    default_lease: Duration,
    max_stored_body: usize,
    header_name: HeaderName,
    completion_retry_window: Duration,
    store_timeout: Duration,
    /// Every detached request and background recording, for [`Idempotency::drain`].
    tracker: tokio_util::task::TaskTracker,
}

/// Configures an [`Idempotency`] engine.
#[derive(Debug)]
pub struct IdempotencyBuilder {
    inner: Inner,
}

impl IdempotencyBuilder {
    /// TTL for handlers that set none (default 24h).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.inner.default_ttl = ttl;
        self
    }

    /// Lease for handlers that set none (default 30s).
    ///
    /// # Panics
    ///
    /// On a zero lease: every claim could be taken over at once.
    pub fn default_lease(mut self, lease: Duration) -> Self {
        assert!(!lease.is_zero(), "the default lease must be positive");
        self.inner.default_lease = lease;
        self
    }

    /// Largest response body stored for replay (default 1 MiB). A larger response is
    /// answered in full the first time; its status and headers are stored, and a replay
    /// says in a problem body that the original body was not kept. The handler never
    /// runs twice because of it.
    pub fn max_stored_body(mut self, bytes: usize) -> Self {
        self.inner.max_stored_body = bytes;
        self
    }

    /// The request header carrying the key (default `Idempotency-Key`).
    pub fn header_name(mut self, name: HeaderName) -> Self {
        self.inner.header_name = name;
        self
    }

    /// How long a finished request keeps trying to record its outcome while the store
    /// is unreachable (default 5 minutes). The client gets its answer after the first
    /// attempts; the rest continues in the background.
    pub fn completion_retry_window(mut self, window: Duration) -> Self {
        self.inner.completion_retry_window = window;
        self
    }

    /// How long one store operation (claim, renew, complete, release) may take before it
    /// counts as failed (default 5s): a database that stopped answering gives `503`
    /// instead of a request that hangs.
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.inner.store_timeout = timeout;
        self
    }

    /// Builds the engine.
    pub fn build(self) -> Idempotency {
        Idempotency {
            inner: Arc::new(self.inner),
        }
    }
}

impl Idempotency {
    /// An engine with the default policy over `store`.
    pub fn new(store: impl Store) -> Self {
        Self::builder(store).build()
    }

    /// A builder over `store`.
    pub fn builder(store: impl Store) -> IdempotencyBuilder {
        Self::builder_shared(Arc::new(store))
    }

    /// A builder over a store that is already shared.
    pub fn builder_shared(store: Arc<dyn Store>) -> IdempotencyBuilder {
        IdempotencyBuilder {
            inner: Inner {
                store,
                default_ttl: DEFAULT_TTL,
                default_lease: DEFAULT_LEASE,
                max_stored_body: DEFAULT_MAX_STORED_BODY,
                header_name: HeaderName::from_static("idempotency-key"),
                completion_retry_window: Duration::from_secs(300),
                store_timeout: Duration::from_secs(5),
                tracker: tokio_util::task::TaskTracker::new(),
            },
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The request header carrying the key.
    pub fn header_name(&self) -> &HeaderName {
        &self.inner.header_name
    }

    /// The TTL a handler with `config` uses.
    pub fn ttl_for(&self, config: &HandlerConfig) -> Duration {
        config.ttl.unwrap_or(self.inner.default_ttl)
    }

    /// The lease a handler with `config` uses.
    pub fn lease_for(&self, config: &HandlerConfig) -> Duration {
        config.lease.unwrap_or(self.inner.default_lease)
    }

    /// Runs `handler` at most once for `(scope, key)` and `fingerprint`:
    ///
    /// - new key (or expired, or a lease that ran out with the same fingerprint): the
    ///   handler runs in a spawned task — a client that hangs up cannot cancel it or the
    ///   recording of its outcome — while the lease is renewed every third of it;
    /// - completed with the same fingerprint: the stored response plus
    ///   `Idempotent-Replayed: true`;
    /// - still running: `409` + `Retry-After`; another fingerprint: `422`;
    /// - store unreachable: `503`, and the handler does not run.
    ///
    /// A 5xx answer or a panic (→ `500`) releases the claim unless the config says
    /// `OnServerError::Store`.
    pub async fn run<F, Fut, R>(
        &self,
        config: &HandlerConfig,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
        handler: F,
    ) -> Response
    where
        F: FnOnce(IdempotencyKey) -> Fut + Send + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: IntoResponse + 'static,
    {
        let span = info_span!("idempotent", scope = %scope, key = %key);
        self.claim_and_execute(config, scope, key, fingerprint, |execution, key| {
            execution.execute(async move { handler(key).await.into_response() })
        })
        .instrument(span)
        .await
    }

    /// Claims the key and, when claimed, runs `execute` — both in one detached task: a
    /// client that hangs up can cancel neither the claim halfway (leaving a claim that
    /// nothing runs) nor the handler.
    async fn claim_and_execute<X, Fut>(
        &self,
        config: &HandlerConfig,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
        execute: X,
    ) -> Response
    where
        X: FnOnce(Execution, IdempotencyKey) -> Fut + Send + 'static,
        Fut: Future<Output = Response> + Send + 'static,
    {
        let (engine, config) = (self.clone(), *config);
        let (scope, key) = (scope.to_owned(), key.to_owned());
        let task = self.spawn_tracked(
            async move {
                match engine.claim(&config, &scope, &key, &fingerprint).await {
                    Ok(execution) => execute(execution, IdempotencyKey::new(scope, key)).await,
                    Err(answer) => answer,
                }
            }
            .in_current_span(),
        );
        join_detached(task).await
    }

    /// Spawns `task` so that [`drain`](Self::drain) waits for it.
    fn spawn_tracked<T: Send + 'static>(
        &self,
        task: impl Future<Output = T> + Send + 'static,
    ) -> tokio::task::JoinHandle<T> {
        self.inner.tracker.spawn(task)
    }

    /// Waits until every request the engine is running, and every outcome it is still
    /// recording, has finished — or `timeout` passed; `true` when all finished. Call it
    /// after the server stopped accepting connections and before the runtime shuts down,
    /// so that no handler is cut off between its side effect and its record.
    pub async fn drain(&self, timeout: Duration) -> bool {
        self.inner.tracker.close();
        let finished = tokio::time::timeout(timeout, self.inner.tracker.wait())
            .await
            .is_ok();
        self.inner.tracker.reopen();
        finished
    }

    /// Claims the key; `Err` carries the answer when the handler must not run (replay,
    /// `409`, `422`, `503`).
    async fn claim(
        &self,
        config: &HandlerConfig,
        scope: &str,
        key: &str,
        fingerprint: &Fingerprint,
    ) -> Result<Execution, Response> {
        let lease = self.lease_for(config);
        let claim = ClaimRequest {
            scope,
            key,
            fingerprint,
            ttl: self.ttl_for(config),
            lease,
            token: FencingToken::random(),
        };
        let outcome = match bounded(self.inner.store_timeout, self.inner.store.try_claim(&claim))
            .await
        {
            Ok(outcome) => outcome,
            Err(err) => {
                error!(event = "store_error", error = %err, "idempotency store unavailable; handler not run");
                return Err(store_unavailable());
            }
        };
        match outcome {
            ClaimOutcome::Replay(stored) => {
                info!(
                    event = "replayed",
                    status = stored.status,
                    "replaying stored response"
                );
                Err(replay(stored))
            }
            ClaimOutcome::InProgress { retry_after } => {
                info!(
                    event = "in_progress",
                    retry_after_secs = retry_after.as_secs(),
                    "original request still running"
                );
                Err(in_progress(retry_after))
            }
            ClaimOutcome::Mismatch => {
                info!(event = "mismatch", "key reused with a different request");
                Err(key_reused())
            }
            ClaimOutcome::Claimed { token } => {
                info!(event = "claimed", "running handler");
                Ok(Execution {
                    engine: self.clone(),
                    config: *config,
                    scope: scope.to_owned(),
                    key: key.to_owned(),
                    token,
                    lease,
                })
            }
        }
    }

    /// Like [`run`](Self::run), for a handler whose writes go to the store's own
    /// database: the handler's writes and the recorded response commit in one
    /// transaction, or neither does (see [`crate::transaction`]). `Ok` with a non-5xx
    /// status commits; `Err` (whatever its status), a 5xx or a panic rolls back and
    /// releases the claim; a lease lost meanwhile rolls back and answers `409`.
    ///
    /// The engine's store must be of database `DB`; otherwise every request is answered
    /// `500` (`transaction_unsupported`) without claiming or running anything. Check at
    /// startup with [`supports_transactions`](Self::supports_transactions).
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub async fn run_in_transaction<DB, F, Fut, T, E>(
        &self,
        config: &HandlerConfig,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
        handler: F,
    ) -> Response
    where
        DB: crate::transaction::TxDatabase,
        F: FnOnce(IdempotencyKey, crate::transaction::Tx<DB>) -> Fut + Send + 'static,
        Fut: Future<Output = (Result<T, E>, crate::transaction::Tx<DB>)> + Send + 'static,
        T: IntoResponse + 'static,
        E: IntoResponse + 'static,
    {
        let span = info_span!("idempotent", scope = %scope, key = %key, transactional = true);
        async move {
            let Some(pool) = DB::pool_of(self.inner.store.as_ref()) else {
                error!(
                    event = "store_error",
                    database = <DB as crate::transaction::TxDatabase>::DATABASE_NAME,
                    "transactional handler on an engine whose store is not of its database"
                );
                return transaction_unsupported(
                    <DB as crate::transaction::TxDatabase>::DATABASE_NAME,
                );
            };
            self.claim_and_execute(config, scope, key, fingerprint, |execution, key| {
                execution.execute_in_transaction(pool, key, handler)
            })
            .await
        }
        .instrument(span)
        .await
    }

    /// Whether transactional handlers on database `DB` can run on this engine's store.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub fn supports_transactions<DB: crate::transaction::TxDatabase>(&self) -> bool {
        DB::pool_of(self.inner.store.as_ref()).is_some()
    }

    /// Purges expired records in batches of `batch` until fewer than a batch remain;
    /// returns how many were deleted.
    pub async fn purge_expired(&self, batch: u32) -> Result<u64, crate::StoreError> {
        if batch == 0 {
            return Ok(0);
        }
        let mut total = 0;
        loop {
            let deleted = self.inner.store.purge_expired(batch).await?;
            total += deleted;
            if deleted < u64::from(batch) {
                return Ok(total);
            }
        }
    }

    /// Spawns a background task that purges expired records every `interval`, in
    /// batches of 1000. Abort the returned handle to stop it.
    ///
    /// # Panics
    ///
    /// On a zero `interval`.
    pub fn spawn_sweeper(&self, interval: Duration) -> tokio::task::JoinHandle<()> {
        assert!(!interval.is_zero(), "the sweeper interval must be positive");
        let engine = self.clone();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                match engine.purge_expired(1000).await {
                    Ok(0) => {}
                    Ok(n) => debug!(
                        event = "purged",
                        records = n,
                        "purged expired idempotency records"
                    ),
                    Err(err) => {
                        warn!(event = "store_error", error = %err, "purging expired records failed")
                    }
                }
            }
        })
    }
}

/// One claimed request: runs the handler, renews the lease meanwhile, records or
/// releases the outcome.
struct Execution {
    engine: Idempotency,
    config: HandlerConfig,
    scope: String,
    key: String,
    token: FencingToken,
    lease: Duration,
}

/// What to do with the claim once the handler finished.
enum Outcome {
    /// Record this response (status, headers, buffered body) and answer it.
    Record(http::response::Parts, bytes::Bytes),
    /// Release the claim and answer this.
    Release(Response),
}

impl Execution {
    async fn execute(self, handler: impl Future<Output = Response> + Send) -> Response {
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

    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    async fn execute_in_transaction<DB, F, Fut, T, E>(
        self,
        pool: sqlx::Pool<DB>,
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
        let begun = tokio::time::timeout(BEGIN_TIMEOUT, DB::begin(&pool)).await;
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
                let completed = DB::complete_in(
                    tx.conn(),
                    self.engine.inner.store.as_ref(),
                    &self.scope,
                    &self.key,
                    self.token,
                    &stored,
                )
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

/// `operation`, failed with [`StoreError::Timeout`] when it takes longer than `timeout`.
async fn bounded<T>(
    timeout: Duration,
    operation: impl Future<Output = Result<T, crate::StoreError>>,
) -> Result<T, crate::StoreError> {
    tokio::time::timeout(timeout, operation)
        .await
        .unwrap_or(Err(crate::StoreError::Timeout(timeout)))
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

/// Rebuilds a stored response, marked as a replay.
fn replay(stored: StoredResponse) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body_kept = stored.body.is_some();
    let mut response = match stored.body {
        Some(body) => Response::new(Body::from(body)),
        None => {
            let problem = Problem::new(
                status,
                codes::RESPONSE_NOT_STORED,
                "Response not stored",
                "The original request completed with this status, but its body was larger \
                 than the idempotency store keeps, so it cannot be replayed. The operation \
                 was not run again; fetch the resource (see Location, if present) instead.",
            );
            Response::new(Body::from(problem.to_json()))
        }
    };
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for (name, value) in stored.headers {
        if !body_kept && name == "content-type" {
            continue;
        }
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::from_bytes(&value))
        {
            headers.append(name, value);
        }
    }
    if !body_kept {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(crate::problem::PROBLEM_JSON),
        );
    }
    headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}

/// Awaits the detached task running a claimed request.
async fn join_detached(task: tokio::task::JoinHandle<Response>) -> Response {
    match task.await {
        Ok(response) => response,
        // Only when the runtime shuts down under the task.
        Err(err) => {
            error!(event = "store_error", error = %err, "handler task did not finish");
            internal_error("the request was interrupted")
        }
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn transaction_unsupported(database: &str) -> Response {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        codes::TRANSACTION_UNSUPPORTED,
        "Transactional handler misconfigured",
        format!(
            "This handler writes through a {database} transaction, but the idempotency engine's store is not a {database} store. Nothing was run."
        ),
    )
    .into_response()
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn lease_lost() -> Response {
    Problem::new(
        StatusCode::CONFLICT,
        codes::IN_PROGRESS,
        "Request in progress",
        "This request's claim on the idempotency key was taken over by a retry before it could commit; its writes were rolled back. Retry with the same key.",
    )
    .with_retry_after(1)
    .into_response()
}

fn in_progress(retry_after: Duration) -> Response {
    let secs = retry_after.as_secs().max(1);
    Problem::new(
        StatusCode::CONFLICT,
        codes::IN_PROGRESS,
        "Request in progress",
        "A request with this idempotency key is still being processed. Retry with the same key after Retry-After seconds.",
    )
    .with_retry_after(secs)
    .into_response()
}

fn key_reused() -> Response {
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        codes::KEY_REUSED,
        "Idempotency key reused",
        "This idempotency key was already used for a different request (method, path, query or body differ). Use a new key for a new operation.",
    )
    .into_response()
}

pub(crate) fn store_unavailable() -> Response {
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        codes::STORE_UNAVAILABLE,
        "Idempotency store unavailable",
        "The request was not processed because its idempotency key could not be checked. Retry with the same key.",
    )
    .with_retry_after(1)
    .into_response()
}

fn internal_error(detail: &str) -> Response {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        codes::HANDLER_PANICKED,
        "Internal server error",
        detail,
    )
    .into_response()
}
