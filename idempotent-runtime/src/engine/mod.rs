//! [`Idempotency`]: the engine every idempotent request runs through. The request's
//! path, top to bottom, is in `protocol`; the other modules are the pieces it calls.

use std::sync::Arc;
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::HeaderName;

use crate::config::HandlerConfig;
use crate::fingerprint::{Fingerprint, RequestFingerprint};
use crate::key::{IdempotencyKey, ScopedKey};
use crate::store::{Capabilities, ForgetOutcome, RecordInfo, Store, StoreError, StoredResponse};

mod answers;
mod builder;
mod capture;
mod claim;
mod execution;
mod function;
mod heartbeat;
mod inline;
mod operator;
mod policy;
mod protocol;
mod record;
mod replay_cache;
mod retry_after;
mod run;
mod settlement;
mod store_call;
mod sweeper;
mod waiting;

pub use builder::IdempotencyBuilder;
pub use function::{Disposition, Failure, Outcome, Refused, StoreUnavailable, Unreadable};
pub use operator::ResolveOutcome;
pub use policy::{
    DEFAULT_LEASE, DEFAULT_MAX_DURATION, DEFAULT_MAX_STORED_BODY, DEFAULT_TTL, NEVER_REPLAYED,
    NEVER_REPLAYED_BECAUSE, REPLAYED_HEADER,
};
pub use replay_cache::ReplayCacheConfig;
use replay_cache::{CachedReplay, ReplayCache};

/// The idempotency engine: one per application, cheap to clone (an `Arc` inside).
///
/// Build it over a [`Store`], put it in the router state and implement `FromRef` so the
/// `#[idempotent]` handlers find it; at shutdown, [`drain`](Self::drain) it:
///
/// ```
/// use std::time::Duration;
///
/// use axum::extract::FromRef;
/// use idempotent_runtime::Idempotency;
/// use idempotent_runtime::store::MemoryStore;
///
/// #[derive(Clone)]
/// struct AppState {
///     idempotency: Idempotency,
///     // … the app's own state
/// }
///
/// impl FromRef<AppState> for Idempotency {
///     fn from_ref(state: &AppState) -> Self {
///         state.idempotency.clone()
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // MemoryStore: one process only. SqliteStore / PostgresStore for real deployments.
/// let idempotency = Idempotency::builder(MemoryStore::new())
///     .default_ttl(Duration::from_secs(24 * 60 * 60)) // for handlers that set no `ttl`
///     .default_lease(Duration::from_secs(30))         // for handlers that set no `lease`
///     .build();
/// let state = AppState { idempotency: idempotency.clone() };
/// // Router::new().route(…, post(handler)).with_state(state), serve, then:
/// assert!(idempotency.drain(Duration::from_secs(30)).await);
/// # let _ = state;
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Idempotency {
    inner: Arc<Inner>,
}

/// What every request and every piece of the engine shares: the store, the configured
/// policy and the process-wide state.
#[derive(Debug)]
struct Inner {
    store: Arc<dyn Store>,
    /// What the store offers beyond its operations, read once from it when the builder
    /// was made.
    capabilities: Capabilities,
    default_ttl: Duration,
    default_lease: Duration,
    max_stored_body: usize,
    default_max_duration: Duration,
    header_name: HeaderName,
    completion_retry_window: Duration,
    store_timeout: Duration,
    /// How long duplicates of handlers that set no `wait` wait (`None`: not at all).
    default_wait: Option<Duration>,
    /// The claims this engine executes for handlers whose duplicates wait.
    running: Arc<waiting::Running>,
    /// How long each handler usually takes, for `Retry-After`.
    durations: retry_after::DurationEstimates,
    /// Every running request and background recording, for [`Idempotency::drain`].
    tracker: tokio_util::task::TaskTracker,
    /// Completed records this process has seen, for replays without a store round trip.
    replay_cache: Option<ReplayCache>,
    /// How the sweeper deletes expired records.
    sweep_pace: sweeper::SweepPace,
    /// How the library's own problem answers reach the client.
    problems: crate::rendering::ProblemRenderer,
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
        IdempotencyBuilder::new(store)
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The request header carrying the key.
    pub fn header_name(&self) -> &HeaderName {
        &self.inner.header_name
    }

    /// Drops `(scope, key)` from this process's replay cache, so that its next request
    /// asks the store. Deleting a record through the engine does this; call it after
    /// deleting records from the store by other means. Other instances' caches may still
    /// replay the record for up to their [`ReplayCacheConfig::max_age`].
    pub fn forget_cached(&self, scope: &str, key: &str) {
        self.inner.forget_cached(scope, key);
    }

    /// Runs `handler` at most once for `(scope, key)` and `fingerprint`:
    ///
    /// - new key (or expired, or a lease that ran out with the same fingerprint): the
    ///   handler runs — in the request's task, moved to a task of its own if the client
    ///   hangs up, so that nothing cancels it or the recording of its outcome — while
    ///   the lease is renewed every third of it;
    /// - completed with the same fingerprint: the stored response plus
    ///   `Idempotent-Replayed: true` (from the replay cache when it holds the record:
    ///   see [`IdempotencyBuilder::replay_cache`]);
    /// - still running: `409` + `Retry-After` — or, when the handler's config (or the
    ///   engine's default) sets a [`wait`](HandlerConfig::wait), the request waits up to
    ///   that long for the original and then claims again: replay, a run of its own if
    ///   the original released its claim, or `409` if it still runs;
    /// - another fingerprint: `422`;
    /// - store unreachable: `503`, and the handler does not run.
    ///
    /// A 5xx answer or a panic (→ `500`) releases the claim unless the config says
    /// `OnServerError::Store`.
    ///
    /// `fingerprint` is the request's [`Fingerprint`], or a [`RequestFingerprint`]: with
    /// the request's bytes at hand, a replay the replay cache answers is compared with
    /// them and needs no hashing.
    pub async fn run<F, Fut, R>(
        &self,
        config: &HandlerConfig,
        scope: &str,
        key: &str,
        fingerprint: impl Into<RequestFingerprint>,
        handler: F,
    ) -> Response
    where
        F: FnOnce(IdempotencyKey) -> Fut + Send + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: IntoResponse + 'static,
    {
        let response =
            protocol::run(&self.inner, config, scope, key, fingerprint.into(), handler).await;
        self.rendered(response)
    }

    /// `response` with a problem the library made itself rendered as the application
    /// asked ([`IdempotencyBuilder::render_problems`]); anything else as it is.
    pub(crate) fn rendered(&self, response: Response) -> Response {
        self.inner.problems.render(response)
    }

    /// The application's renderer of the library's problems, if it gave one.
    pub(crate) fn problem_renderer(&self) -> Option<&crate::rendering::ProblemRenderer> {
        Some(&self.inner.problems).filter(|renderer| renderer.is_set())
    }

    /// Runs `handler` without idempotency protection: what `key = optional` (and
    /// [`IdempotencyLayer::key_optional`](crate::layer::IdempotencyLayer::key_optional))
    /// do with a request that carries no key. Nothing is claimed, stored or replayed, and
    /// the handler runs in the request's own task, as an unprotected handler would.
    pub(crate) async fn run_unprotected<Fut, R>(
        &self,
        config: &HandlerConfig,
        handler: Fut,
    ) -> Response
    where
        Fut: Future<Output = R>,
        R: IntoResponse,
    {
        protocol::run_unprotected(config, handler).await
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
    ///
    /// `handler` is an async closure that borrows the transaction,
    /// `async move |key, tx: &mut Tx<DB>| …`, as for
    /// [`once_in_transaction`](Self::once_in_transaction).
    #[cfg(feature = "sql")]
    pub async fn run_in_transaction<DB, F, T, E>(
        &self,
        config: &HandlerConfig,
        scope: &str,
        key: &str,
        fingerprint: impl Into<RequestFingerprint>,
        handler: F,
    ) -> Response
    where
        DB: crate::transaction::TxDatabase,
        F: AsyncFnOnce(IdempotencyKey, &mut crate::transaction::Tx<DB>) -> Result<T, E>
            + for<'tx> crate::transaction::TxFunction<'tx, DB, T, E>
            + Send
            + 'static,
        T: IntoResponse + 'static,
        E: IntoResponse + 'static,
    {
        // The engine's transactional path takes the transaction back with the result.
        let handler = move |key, mut tx: crate::transaction::Tx<DB>| async move {
            let result = handler(key, &mut tx).await;
            (result, tx)
        };
        self.run_in_transaction_owned(config, scope, key, fingerprint.into(), handler)
            .await
    }

    /// [`run_in_transaction`](Self::run_in_transaction) for a handler that takes the
    /// transaction and gives it back with its result: the attribute's expansion.
    #[cfg(feature = "sql")]
    pub(crate) async fn run_in_transaction_owned<DB, F, Fut, T, E>(
        &self,
        config: &HandlerConfig,
        scope: &str,
        key: &str,
        fingerprint: RequestFingerprint,
        handler: F,
    ) -> Response
    where
        DB: crate::transaction::TxDatabase,
        F: FnOnce(IdempotencyKey, crate::transaction::Tx<DB>) -> Fut + Send + 'static,
        Fut: Future<Output = (Result<T, E>, crate::transaction::Tx<DB>)> + Send + 'static,
        T: IntoResponse + 'static,
        E: IntoResponse + 'static,
    {
        let response =
            protocol::run_in_transaction(&self.inner, config, scope, key, fingerprint, handler)
                .await;
        self.rendered(response)
    }

    /// Runs `function` at most once for `(scope, key)` and `fingerprint`, and hands every
    /// duplicate its recorded output: the entry point for whatever is not an HTTP
    /// request (a queue consumer, a scheduled job, a plain call). The same protocol as
    /// [`run`](Self::run) — the same store, claim, lease and heartbeat, waiting
    /// ([`HandlerConfig::wait`]), replay cache and steps (`function` gets the
    /// [`IdempotencyKey`]: [`step`](IdempotencyKey::step) and
    /// [`derive`](IdempotencyKey::derive) work) — answered as a typed [`Outcome`]:
    ///
    /// - `Ok(output)`: the output is serialised (JSON) into the record; this call gets
    ///   [`Outcome::Ran`], every duplicate [`Outcome::Replayed`] with the output
    ///   deserialised;
    /// - `Err(error)`: nothing is recorded and the claim is released, so the next call
    ///   runs `function` again ([`Outcome::Failed`]); a panic does the same;
    /// - see [`Outcome`] for a duplicate of a running call, another payload under the
    ///   key, and a store outage.
    ///
    /// `fingerprint` is what the key must keep meaning: a message's payload
    /// ([`Fingerprint::of_payload`]), or any [`Fingerprint`]. Of `config`, what concerns
    /// an HTTP response (`on_server_error`, `exclude_headers`, `fingerprint`,
    /// `key_optional`) does not apply: `Err` always releases, and the output is kept up
    /// to [`max_stored_body`](IdempotencyBuilder::max_stored_body) bytes of JSON (past
    /// that it is recorded without it, and duplicates get [`Outcome::Unreadable`]).
    ///
    /// ```
    /// use idempotent_runtime::store::MemoryStore;
    /// use idempotent_runtime::{Fingerprint, HandlerConfig, Idempotency, Outcome};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// const CHARGE: HandlerConfig = HandlerConfig::new().name("charge");
    /// let idempotency = Idempotency::new(MemoryStore::new());
    /// let payload = br#"{"amount":100}"#;
    /// let charge = || {
    ///     idempotency.once(&CHARGE, "orders", "msg-1", Fingerprint::of_payload(payload), |key| async move {
    ///         // key.derive("gateway") is the key to send the payment provider.
    ///         Ok::<_, std::io::Error>(format!("charged under {}", key.derive("gateway")))
    ///     })
    /// };
    /// let Outcome::Ran(first) = charge().await else { panic!("runs once") };
    /// let Outcome::Replayed(again) = charge().await else { panic!("then replays") };
    /// assert_eq!(first, again);
    /// # }
    /// ```
    pub async fn once<F, Fut, T, E>(
        &self,
        config: &HandlerConfig,
        scope: &str,
        key: &str,
        fingerprint: impl Into<RequestFingerprint>,
        function: F,
    ) -> Outcome<T, E>
    where
        F: FnOnce(IdempotencyKey) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
        E: Send + 'static,
    {
        function::once(
            &self.inner,
            config,
            scope,
            key,
            fingerprint.into(),
            function,
        )
        .await
    }

    /// Like [`once`](Self::once), for a function whose writes go to the store's own
    /// database: its writes through the [`Tx`](crate::transaction::Tx) and its recorded
    /// output commit in one transaction, or neither does — a transactional inbox. `Ok`
    /// commits ([`Outcome::Ran`]); `Err`, a panic or a run past the maximum duration
    /// rolls back and releases the claim ([`Outcome::Failed`]); a lease lost meanwhile
    /// rolls back ([`Failure::LeaseLost`]). Steps are refused inside it, as in a
    /// transactional handler: its writes commit all or nothing, there is nothing to
    /// resume.
    ///
    /// The engine's store must be of database `DB`; otherwise every call is
    /// [`Outcome::Refused`] without running (check at startup with
    /// [`supports_transactions`](Self::supports_transactions)).
    ///
    /// `function` is an async closure that borrows the transaction; it must own what it
    /// uses (`async move`), and its future must be `Send`, because the engine finishes it
    /// in a task when the caller stops waiting.
    ///
    /// ```
    /// use idempotent_runtime::store::SqliteStore;
    /// use idempotent_runtime::transaction::Tx;
    /// use idempotent_runtime::{Fingerprint, HandlerConfig, Idempotency, Outcome};
    /// use sqlx::Sqlite;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("app.db");
    /// let store = SqliteStore::connect(path.to_str().unwrap()).await?;
    /// sqlx::query("CREATE TABLE ledger (message TEXT PRIMARY KEY, cents INTEGER)")
    ///     .execute(store.pool())
    ///     .await?;
    /// let idempotency = Idempotency::new(store);
    /// let outcome = idempotency
    ///     .once_in_transaction(&HandlerConfig::new(), "orders", "msg-1",
    ///         Fingerprint::of_payload(b"100"), async |key, tx: &mut Tx<Sqlite>| {
    ///             sqlx::query("INSERT INTO ledger VALUES (?, 100)")
    ///                 .bind(key.as_str())
    ///                 .execute(tx.conn())
    ///                 .await?;
    ///             Ok(100)
    ///         })
    ///     .await;
    /// assert!(matches!(outcome, Outcome::<i64, sqlx::Error>::Ran(100)));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "sql")]
    pub async fn once_in_transaction<DB, F, T, E>(
        &self,
        config: &HandlerConfig,
        scope: &str,
        key: &str,
        fingerprint: impl Into<RequestFingerprint>,
        function: F,
    ) -> Outcome<T, E>
    where
        DB: crate::transaction::TxDatabase,
        F: AsyncFnOnce(IdempotencyKey, &mut crate::transaction::Tx<DB>) -> Result<T, E>
            + for<'tx> crate::transaction::TxFunction<'tx, DB, T, E>
            + Send
            + 'static,
        T: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
        E: Send + 'static,
    {
        // The engine's transactional path takes the transaction back with the result.
        let function = move |key, mut tx: crate::transaction::Tx<DB>| async move {
            let result = function(key, &mut tx).await;
            (result, tx)
        };
        self.once_in_transaction_owned(config, scope, key, fingerprint.into(), function)
            .await
    }

    /// [`once_in_transaction`](Self::once_in_transaction) for a function that takes the
    /// transaction and gives it back with its result: the attribute's expansion.
    #[cfg(feature = "sql")]
    pub(crate) async fn once_in_transaction_owned<DB, F, Fut, T, E>(
        &self,
        config: &HandlerConfig,
        scope: &str,
        key: &str,
        fingerprint: RequestFingerprint,
        function: F,
    ) -> Outcome<T, E>
    where
        DB: crate::transaction::TxDatabase,
        F: FnOnce(IdempotencyKey, crate::transaction::Tx<DB>) -> Fut + Send + 'static,
        Fut: Future<Output = (Result<T, E>, crate::transaction::Tx<DB>)> + Send + 'static,
        T: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
        E: Send + 'static,
    {
        function::once_in_transaction(&self.inner, config, scope, key, fingerprint, function).await
    }

    /// Whether transactional handlers on database `DB` can run on this engine's store.
    #[cfg(feature = "sql")]
    pub fn supports_transactions<DB: crate::transaction::TxDatabase>(&self) -> bool {
        protocol::tx_store::<DB>(&self.inner.capabilities).is_some()
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

    /// The live record of `(scope, key)` as the store sees it now (state, fingerprint,
    /// recorded status, created/expiry times, lease and whether its holder is alive), or
    /// `None` when there is none; see [`Store::inspect`].
    ///
    /// # Errors
    ///
    /// The store's error, or [`StoreError::Timeout`] after the engine's store timeout.
    pub async fn inspect(&self, scope: &str, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        operator::inspect(&self.inner, scope, key).await
    }

    /// Deletes the record of `(scope, key)` so the next request with the key runs as new;
    /// refuses ([`ForgetOutcome::Refused`]) while a request runs under it with a live
    /// lease, unless `force`. See [`Store::forget`] for the exact
    /// rules. A forced forget lets a retry run the handler while the original may still
    /// be running: use it only when the holder is known to be gone (its process died, and
    /// its lease has not run out yet). If it is still running after all, its next
    /// heartbeat finds the claim gone and raises
    /// [`IdempotencyKey::lease_lost`](crate::key::IdempotencyKey::lease_lost), a transactional
    /// handler's writes roll back, and its response is not recorded (fencing).
    ///
    /// This engine's [replay cache](IdempotencyBuilder::replay_cache) drops the
    /// key at once; other instances' caches may still replay a completed record for up to
    /// their [`max_age`](ReplayCacheConfig::max_age) (default 10 s).
    ///
    /// Every call is logged (`event = "forgotten"`, or `"forget_refused"`).
    ///
    /// # Errors
    ///
    /// The store's error, or [`StoreError::Timeout`] after the engine's store timeout
    /// (the record may or may not have been deleted then: inspect or forget again).
    pub async fn forget(
        &self,
        scope: &str,
        key: &str,
        force: bool,
    ) -> Result<ForgetOutcome, StoreError> {
        operator::forget(&self.inner, scope, key, force).await
    }

    /// Operator tool: records `output` (the step's output as JSON) for at-most-once step
    /// `name` of the request under `(scope, key)`, whose earlier call has an unknown
    /// outcome ([`StepError::OutcomeUnknown`](crate::StepError::OutcomeUnknown),
    /// [`RecordInfo::unknown_outcomes`]): the operator checked what happened (at the
    /// provider, say), and the request's next retry resumes with this output instead of
    /// asking again. `output` must deserialise as the step's output type, or the retry
    /// answers [`StepError::Undecodable`](crate::StepError::Undecodable).
    ///
    /// Refused ([`ResolveOutcome::Running`]) while a request runs under the record. If the
    /// call never happened, [`forget`](Self::forget) the key instead: the retry then runs
    /// the request as new. Logged (`event = "step_resolved"`).
    ///
    /// # Errors
    ///
    /// The store's error, or [`StoreError::Timeout`] after the engine's store timeout.
    pub async fn resolve_step(
        &self,
        scope: &str,
        key: &str,
        name: &str,
        output: &serde_json::Value,
    ) -> Result<ResolveOutcome, StoreError> {
        operator::resolve_step(&self.inner, scope, key, name, output).await
    }

    /// Purges expired records in batches of `batch` until fewer than a batch remain;
    /// returns how many were deleted. It waits the
    /// [`sweep_pause`](IdempotencyBuilder::sweep_pause) between two batches, as the
    /// sweeper does.
    pub async fn purge_expired(&self, batch: u32) -> Result<u64, StoreError> {
        let pace = sweeper::SweepPace {
            batch,
            ..self.inner.sweep_pace
        };
        sweeper::purge_expired(self.inner.store.as_ref(), pace).await
    }

    /// The replay cache's entries and the bytes it accounts for them against its
    /// [`max_bytes`](ReplayCacheConfig::max_bytes) bound (`None` without a cache): per
    /// entry its scope, key, headers (twice: as stored and as replayed), body and the
    /// request copy it learned, plus a fixed overhead for its map and queue slots and its
    /// replay. Cheap enough to export as a gauge: it locks each of the cache's shards in
    /// turn and walks no entries.
    pub fn replay_cache_usage(&self) -> Option<crate::store::MemoryUsage> {
        self.inner.replay_cache.as_ref().map(ReplayCache::usage)
    }

    /// Spawns a background task that purges expired records every `interval`, in
    /// batches of [`sweep_batch`](IdempotencyBuilder::sweep_batch) (default 5000) with
    /// [`sweep_pause`](IdempotencyBuilder::sweep_pause) between them (default none).
    /// Abort the returned handle to stop it.
    ///
    /// # Panics
    ///
    /// On a zero `interval`.
    pub fn spawn_sweeper(&self, interval: Duration) -> tokio::task::JoinHandle<()> {
        sweeper::spawn_sweeper(self.inner.store.clone(), interval, self.inner.sweep_pace)
    }
}

/// The policy each handler gets, for the OpenAPI description of its routes.
#[cfg(feature = "utoipa")]
impl Idempotency {
    /// The TTL a handler with `config` uses.
    pub(crate) fn ttl_for(&self, config: &HandlerConfig) -> Duration {
        self.inner.ttl_for(config)
    }

    /// The maximum duration a handler with `config` has.
    pub(crate) fn max_duration_for(&self, config: &HandlerConfig) -> Duration {
        self.inner.max_duration_for(config)
    }

    /// The lease a handler with `config` uses.
    pub(crate) fn lease_for(&self, config: &HandlerConfig) -> Duration {
        self.inner.lease_for(config)
    }

    /// How long a duplicate of a handler with `config` waits (`None`: not at all).
    pub(crate) fn wait_for(&self, config: &HandlerConfig) -> Option<Duration> {
        self.inner.wait_for(config)
    }
}

impl Inner {
    /// The TTL a handler with `config` uses.
    fn ttl_for(&self, config: &HandlerConfig) -> Duration {
        config.ttl.unwrap_or(self.default_ttl)
    }

    /// The maximum duration a handler with `config` has.
    fn max_duration_for(&self, config: &HandlerConfig) -> Duration {
        config.max_duration.unwrap_or(self.default_max_duration)
    }

    /// The lease a handler with `config` uses.
    fn lease_for(&self, config: &HandlerConfig) -> Duration {
        config.lease.unwrap_or(self.default_lease)
    }

    /// How long a duplicate of a handler with `config` waits (`None`: not at all).
    fn wait_for(&self, config: &HandlerConfig) -> Option<Duration> {
        config
            .wait
            .or(self.default_wait)
            .filter(|wait| !wait.is_zero())
            .map(|wait| wait.min(self.max_duration_for(config)))
    }

    /// Drops `(scope, key)` from this process's replay cache, if there is one.
    fn forget_cached(&self, scope: &str, key: &str) {
        if let Some(cache) = &self.replay_cache {
            cache.invalidate(scope, key);
        }
    }

    /// Caches a completed record: this process's own completion (bounded by its claim's
    /// TTL) or a replay the store answered (bounded by the life it reported), read or
    /// written by a store call sent at cache time `read_at`. Returns the record ready to
    /// replay, or gives it back when there is no cache.
    fn remember(
        &self,
        name: &ScopedKey,
        fingerprint: Fingerprint,
        stored: StoredResponse,
        lives_until: i64,
        read_at: i64,
    ) -> Result<Arc<CachedReplay>, StoredResponse> {
        match &self.replay_cache {
            Some(cache) => Ok(cache.insert(name, fingerprint, stored, lives_until, read_at)),
            None => Err(stored),
        }
    }
}
