//! [`Idempotency`]: the claim → execute → record loop every idempotent request runs.

use std::sync::Arc;
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use http::HeaderName;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::clock::millis;
use crate::config::HandlerConfig;
use crate::fingerprint::{Fingerprint, RequestFingerprint};
use crate::key::{IdempotencyKey, ScopedKey};
use crate::metrics::{self, Outcome, StoreOperation};
use crate::store::{ClaimOutcome, ClaimRequest, FencingToken, Store};

mod answers;
mod capture;
mod deadline;
mod execution;
mod inline;
mod operator;
mod replay_cache;
mod retry_after;
mod waiting;

pub(crate) use answers::store_unavailable;
#[cfg(feature = "sql")]
use answers::transaction_unsupported;
use answers::{in_progress, internal_error, key_reused, replay, scope_empty};
use deadline::ByDeadline;
use execution::Execution;
use inline::Uncancellable;
pub use replay_cache::ReplayCacheConfig;
use replay_cache::{Cached, ReplayCache};
use waiting::{Attempt, Settled};

/// The header marking a replayed response.
pub use idempotent_policy::REPLAYED_HEADER;

/// Response headers never stored or replayed: they describe one response or one
/// connection, not the operation (`Date`, `Set-Cookie`, hop-by-hop headers; any header a
/// `Connection` field names is hop-by-hop too). `Content-Length` is recomputed for the
/// replayed body. Every other header is replayed as the handler sent it, unless the
/// handler excludes it ([`HandlerConfig::exclude_headers`]). The reason for each is in
/// [`NEVER_REPLAYED_BECAUSE`], the list the attribute macro checks `exclude_headers`
/// against.
pub use idempotent_policy::NEVER_REPLAYED;
pub use idempotent_policy::NEVER_REPLAYED_BECAUSE;

/// Default TTL: Stripe's 24 hours.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Default lease: 30 seconds, renewed every third of it while the handler runs.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default maximum duration of a handler and its response body: 5 minutes.
pub const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(5 * 60);
/// Default cap on a stored response body: 1 MiB.
pub const DEFAULT_MAX_STORED_BODY: usize = 1024 * 1024;

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

#[derive(Debug)]
struct Inner {
    store: Arc<dyn Store>,
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
}

/// Configures an [`Idempotency`] engine.
#[derive(Debug)]
pub struct IdempotencyBuilder {
    inner: Inner,
    replay_cache: Option<ReplayCacheConfig>,
}

impl IdempotencyBuilder {
    /// TTL for handlers that set none (default 24h).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.inner.default_ttl = ttl;
        self
    }

    /// Lease for handlers that set none (default 30s).
    ///
    /// **Leases are the only licence to run.** The engine counts a lease from when it sent
    /// the claim or renewal that granted it, on its own monotonic clock, and treats it as
    /// ending a tenth early: a claim answered after that is released and answered `503`,
    /// and [`IdempotencyKey::lease_lost`](crate::IdempotencyKey::lease_lost) turns true
    /// then. Keep every lease at least three times the [store
    /// timeout](Self::store_timeout), and on SQLite at least three times the longest a
    /// transactional handler may hold the write lock (`SqliteStore::with_max_transaction_hold`,
    /// 5 s by default). A wall-clock step cannot expire a live lease on the memory store,
    /// nor on SQLite on Linux (leases there count on the host's boot clock); database
    /// servers judge leases on their own clock.
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

    /// How long a handler that sets none may run, its response body included (default
    /// 5 minutes). Past it a plain handler is interrupted and recorded as such (`500`
    /// `request_interrupted`, replayed: it may have taken effect, so it never runs again
    /// under the key); a response body still streaming is sent on but recorded without
    /// its bytes; a transactional handler is rolled back and its claim released.
    ///
    /// # Panics
    ///
    /// On a zero duration.
    pub fn default_max_duration(mut self, max: Duration) -> Self {
        assert!(!max.is_zero(), "the maximum duration must be positive");
        self.inner.default_max_duration = max;
        self
    }

    /// The request header carrying the key (default `Idempotency-Key`).
    pub fn header_name(mut self, name: HeaderName) -> Self {
        self.inner.header_name = name;
        self
    }

    /// How long a finished request keeps trying to record its outcome while the store
    /// is unreachable (default 30 s). The client gets its answer after the first
    /// attempts; the rest continues in the background, and [`Idempotency::drain`] waits
    /// for it: drain with at least this long at shutdown, or a response that was sent
    /// may go unrecorded (its claim then frees when the lease runs out, and a retry runs
    /// the handler again). Past the window the attempts go on for as long as the lease
    /// is still renewed (the store applies renewals but not the completion), up to the
    /// record's TTL, logged as an error and counted `completion_overdue` once: giving
    /// the key up while holding it would let a retry run the handler again.
    pub fn completion_retry_window(mut self, window: Duration) -> Self {
        self.inner.completion_retry_window = window;
        self
    }

    /// How long one store operation (claim, renew, complete, release) may take before it
    /// counts as failed (default 5s): a database that stopped answering gives `503`
    /// instead of a request that hangs.
    ///
    /// Keep leases at least three times the store timeout, so that one stalled renewal
    /// still leaves time for the next: for a handler whose lease is shorter, a renewal's
    /// timeout is cut to a third of its lease. A claim whose answer comes back later than
    /// nine tenths of its lease after it was sent is never run, whatever this timeout
    /// allows: the engine releases it and answers `503` (see [`crate::IdempotencyKey::lease_lost`]
    /// for the same rule while the handler runs).
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.inner.store_timeout = timeout;
        self
    }

    /// How long a duplicate that finds the original still running waits for its outcome,
    /// for handlers that set no `wait` (default: off, the duplicate gets `409` at once;
    /// a zero wait also means off). See [`HandlerConfig::wait`].
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.inner.default_wait = Some(wait).filter(|wait| !wait.is_zero());
        self
    }

    /// The replay cache's bounds (default: on, [`ReplayCacheConfig::new`]), or `None` to
    /// turn it off.
    ///
    /// With it, a replay of a completed record the store replayed to this process
    /// recently is answered from memory: no store round trip, nothing spawned; a request
    /// reusing its key with another body gets its `422` the same way. So a key's first
    /// replay asks the store, and its later ones do not (or its first one too, with
    /// [`remember_completions`](ReplayCacheConfig::remember_completions), for the keys
    /// this process completed). An entry never outlives its record's TTL, and is served
    /// at most [`max_age`](ReplayCacheConfig::max_age) before the store is asked again:
    /// how long another instance may still replay a record deleted on this one.
    /// In-progress and released claims are never cached. See [`ReplayCacheConfig`] for
    /// the bounds.
    pub fn replay_cache(mut self, config: Option<ReplayCacheConfig>) -> Self {
        self.replay_cache = config;
        self
    }

    /// Builds the engine (and [describes](crate::metrics::describe) its metrics to the
    /// recorder installed by then, if any).
    pub fn build(mut self) -> Idempotency {
        metrics::describe();
        self.inner.replay_cache = self.replay_cache.map(|config| {
            let store = &self.inner.store;
            ReplayCache::new(config, store.clock(), store.in_process())
        });
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
                default_max_duration: DEFAULT_MAX_DURATION,
                header_name: HeaderName::from_static("idempotency-key"),
                completion_retry_window: Duration::from_secs(30),
                store_timeout: Duration::from_secs(5),
                default_wait: None,
                running: Arc::default(),
                durations: retry_after::DurationEstimates::default(),
                tracker: tokio_util::task::TaskTracker::new(),
                replay_cache: None,
            },
            replay_cache: Some(ReplayCacheConfig::new()),
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

    /// Drops `(scope, key)` from this process's replay cache, so that its next request
    /// asks the store. Deleting a record through the engine does this; call it after
    /// deleting records from the store by other means. Other instances' caches may still
    /// replay the record for up to their [`ReplayCacheConfig::max_age`].
    pub fn forget_cached(&self, scope: &str, key: &str) {
        if let Some(cache) = &self.inner.replay_cache {
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
        stored: crate::store::StoredResponse,
        lives_until: i64,
        read_at: i64,
    ) -> Result<Arc<replay_cache::CachedReplay>, crate::store::StoredResponse> {
        match &self.inner.replay_cache {
            Some(cache) => Ok(cache.insert(name, fingerprint, stored, lives_until, read_at)),
            None => Err(stored),
        }
    }

    /// The TTL a handler with `config` uses.
    pub(crate) fn ttl_for(&self, config: &HandlerConfig) -> Duration {
        config.ttl.unwrap_or(self.inner.default_ttl)
    }

    /// The maximum duration a handler with `config` has.
    pub(crate) fn max_duration_for(&self, config: &HandlerConfig) -> Duration {
        config
            .max_duration
            .unwrap_or(self.inner.default_max_duration)
    }

    /// The lease a handler with `config` uses.
    pub(crate) fn lease_for(&self, config: &HandlerConfig) -> Duration {
        config.lease.unwrap_or(self.inner.default_lease)
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
        let span = info_span!("idempotent", scope = %scope, key = %key);
        self.claim_and_execute(config, scope, key, fingerprint.into(), |execution, key| {
            // Boxed: the engine's layers around it then move a pointer, not the handler's
            // whole future (the request's work measured 4,064 -> 3,256 bytes).
            execution.execute(Box::pin(async move { handler(key).await.into_response() }))
        })
        .instrument(span)
        .await
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
        // Every unprotected run passes here: the place to count them.
        metrics::count(config.name, Outcome::Unprotected);
        debug!(
            event = "unprotected",
            handler = config.name.unwrap_or("unnamed"),
            "no idempotency key; running the handler unprotected (key = optional)"
        );
        handler.await.into_response()
    }

    /// Answers from the replay cache when it can; otherwise claims the key and, when
    /// claimed, runs `execute` — both [`Uncancellable`]: a client that hangs up can
    /// cancel neither the claim halfway (leaving a claim that nothing runs) nor the
    /// handler.
    async fn claim_and_execute<X, Fut>(
        &self,
        config: &HandlerConfig,
        scope: &str,
        key: &str,
        request: RequestFingerprint,
        execute: X,
    ) -> Response
    where
        X: FnOnce(Execution, IdempotencyKey) -> Fut + Send + 'static,
        Fut: Future<Output = Response> + Send + 'static,
    {
        if scope.trim().is_empty() {
            // One key space for every caller whose scope came out empty (say, from
            // optional authentication) would replay one caller's answer to another.
            error!(
                event = "scope_empty",
                "the scope argument yielded an empty scope; refusing to run unscoped"
            );
            return scope_empty();
        }
        if let Some(cache) = &self.inner.replay_cache {
            match cache.get(scope, key, &request) {
                Cached::Hit(cached) => {
                    metrics::count(config.name, Outcome::Replayed);
                    info!(
                        event = "replayed",
                        status = cached.status(),
                        cached = true,
                        "replaying stored response"
                    );
                    return cached.response();
                }
                Cached::Mismatch => {
                    metrics::count(config.name, Outcome::Mismatch);
                    info!(
                        event = "mismatch",
                        cached = true,
                        "key reused with a different request"
                    );
                    return key_reused();
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
            let (engine, config, name) = (self.clone(), *config, name.clone());
            let work = async move {
                // The handler's future is built inside the match and awaited after it:
                // awaited inside, the claim's result and the execution moved out of it
                // would each keep their bytes in this future beside the one awaited.
                let run = match engine.claim(&config, &name, &fingerprint).await {
                    Ok(execution) => {
                        let lease = execution.lease_signal.clone();
                        let key = IdempotencyKey::claimed(name, fingerprint, lease);
                        execute(execution, key)
                    }
                    Err(Refused::Answer(settled, answer)) => {
                        return Attempt::Done(settled, answer);
                    }
                    Err(Refused::InProgress(retry_after)) => {
                        return Attempt::InProgress(retry_after, execute);
                    }
                };
                Attempt::Done(Settled::Ran, run.await)
            };
            Uncancellable::new(work, &self.inner.tracker, interrupted)
        };
        match self.wait_for(config) {
            None => match attempt(execute).await {
                Attempt::Done(_, answer) => answer,
                Attempt::InProgress(retry_after, _) => self.in_progress(config, retry_after),
            },
            // Boxed: only handlers whose duplicates wait pay for its state in their
            // request's future.
            Some(wait) => {
                Box::pin(self.claim_waiting(config, scope, key, wait, execute, attempt)).await
            }
        }
    }

    /// The `409` + `Retry-After` for a duplicate that finds the key still in progress
    /// (the store's `retry_after`: until the holder's lease runs out).
    fn in_progress(&self, config: &HandlerConfig, retry_after: Duration) -> Response {
        metrics::count(config.name, Outcome::InProgress);
        let retry_after = self.inner.durations.retry_after(config.name, retry_after);
        info!(
            event = "in_progress",
            retry_after_secs = retry_after.as_secs(),
            "original request still running"
        );
        in_progress(retry_after)
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

    /// Claims the key; `Err` says why the handler must not run (replay, `422`, `503`, or
    /// the key in progress).
    async fn claim(
        &self,
        config: &HandlerConfig,
        name: &ScopedKey,
        fingerprint: &Fingerprint,
    ) -> Result<Execution, Refused> {
        let (scope, key) = (name.scope(), name.key());
        let lease = self.lease_for(config);
        let claim = ClaimRequest {
            scope,
            key,
            fingerprint,
            ttl: self.ttl_for(config),
            lease,
            token: FencingToken::random(),
        };
        // Before the claim is sent: the store's lease ends no earlier than this + lease,
        // and a record it reports ends no earlier than the cache's time now + its life.
        let sent_at = tokio::time::Instant::now();
        let cache_now = self.inner.replay_cache.as_ref().map_or(0, ReplayCache::now);
        let claimed = timed_store_call(
            StoreOperation::Claim,
            sent_at,
            self.inner.store_timeout,
            self.inner.store.claim_with_expiry(&claim),
        );
        let (claimed, answered_at) = claimed.await;
        let (outcome, expires_in) = match claimed {
            Ok(outcome) => outcome,
            Err(err) => {
                error!(event = "store_error", error = %err, "idempotency store unavailable; handler not run");
                metrics::count(config.name, Outcome::StoreError);
                return Err(Refused::Answer(Settled::Failed, store_unavailable()));
            }
        };
        // A `409` counts once, where it is answered: a waiting duplicate may find the key
        // in progress several times before it settles.
        if let Some(counted) = claim_metric(&outcome) {
            metrics::count(config.name, counted);
        }
        match outcome {
            ClaimOutcome::Replay(stored) => {
                info!(
                    event = "replayed",
                    status = stored.status,
                    "replaying stored response"
                );
                let answer = match expires_in {
                    Some(life) => {
                        let lives_until = cache_now.saturating_add(millis(life));
                        match self.remember(name, *fingerprint, stored, lives_until, cache_now) {
                            Ok(cached) => cached.response(),
                            Err(stored) => replay(stored),
                        }
                    }
                    None => replay(stored),
                };
                Err(Refused::Answer(Settled::Replayed, answer))
            }
            ClaimOutcome::InProgress { retry_after } => Err(Refused::InProgress(retry_after)),
            ClaimOutcome::Mismatch => {
                info!(event = "mismatch", "key reused with a different request");
                Err(Refused::Answer(Settled::Mismatch, key_reused()))
            }
            ClaimOutcome::Claimed { token, takeover } => {
                if !crate::lease::licence_holds(answered_at - sent_at, lease) {
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
                    self.release_late_claim(name, token).await;
                    return Err(Refused::Answer(Settled::Failed, store_unavailable()));
                }
                match takeover {
                    None => info!(event = "claimed", "running handler"),
                    Some(reason) => info!(
                        event = "taken_over",
                        reason = reason.as_str(),
                        "took over an earlier record of this key; running handler"
                    ),
                }
                // Only handlers whose duplicates wait are tracked: nobody else listens.
                let registration = self
                    .wait_for(config)
                    .map(|_| self.inner.running.register(scope, key, token));
                Ok(Execution {
                    engine: self.clone(),
                    _registration: registration,
                    config: *config,
                    name: name.clone(),
                    fingerprint: *fingerprint,
                    lives_until: cache_now.saturating_add(millis(claim.ttl)),
                    token,
                    lease,
                    claimed_at: sent_at,
                    claim_answered_at: answered_at,
                    lease_signal: Arc::new(crate::lease::LeaseSignal::new(sent_at, lease)),
                })
            }
        }
    }

    /// Releases a claim that came back too late to run (its token fences it: a retry
    /// that took the key over meanwhile keeps it).
    async fn release_late_claim(&self, name: &ScopedKey, token: FencingToken) {
        let release = self.inner.store.release(name.scope(), name.key(), token);
        let now = tokio::time::Instant::now();
        match store_call(
            StoreOperation::Release,
            now,
            self.inner.store_timeout,
            release,
        )
        .await
        {
            Ok(_) => {}
            Err(err) => {
                warn!(event = "store_error", error = %err, "releasing a late claim failed; it frees when its lease runs out")
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
    #[cfg(feature = "sql")]
    pub async fn run_in_transaction<DB, F, Fut, T, E>(
        &self,
        config: &HandlerConfig,
        scope: &str,
        key: &str,
        fingerprint: impl Into<RequestFingerprint>,
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
            // Resolved once: the same handle begins the transaction and records in it.
            let Some(tx_store) = self.tx_store::<DB>() else {
                error!(
                    event = "store_error",
                    database = DB::DATABASE_NAME,
                    "transactional handler on an engine whose store is not of its database"
                );
                return transaction_unsupported(DB::DATABASE_NAME);
            };
            self.claim_and_execute(config, scope, key, fingerprint.into(), |execution, key| {
                execution.execute_in_transaction(tx_store, key, handler)
            })
            .await
        }
        .instrument(span)
        .await
    }

    /// Whether transactional handlers on database `DB` can run on this engine's store.
    #[cfg(feature = "sql")]
    pub fn supports_transactions<DB: crate::transaction::TxDatabase>(&self) -> bool {
        self.tx_store::<DB>().is_some()
    }

    #[cfg(feature = "sql")]
    fn tx_store<DB: crate::transaction::TxDatabase>(
        &self,
    ) -> Option<Arc<dyn crate::transaction::TxStore<DB>>> {
        self.inner.store.transactions()?.for_database::<DB>()
    }

    /// Purges expired records in batches of `batch` until fewer than a batch remain;
    /// returns how many were deleted.
    pub async fn purge_expired(&self, batch: u32) -> Result<u64, crate::StoreError> {
        if batch == 0 {
            return Ok(0);
        }
        let mut total = 0;
        loop {
            let purged = self.inner.store.purge_expired(batch);
            let deleted = metrics::timed(StoreOperation::Purge, purged).await?;
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

/// The `outcome` a claim's answer counts under; `None` for a key in progress, counted
/// by [`Idempotency::in_progress`] when the `409` is answered.
fn claim_metric(outcome: &ClaimOutcome) -> Option<Outcome> {
    match outcome {
        ClaimOutcome::Replay(_) => Some(Outcome::Replayed),
        ClaimOutcome::InProgress { .. } => None,
        ClaimOutcome::Mismatch => Some(Outcome::Mismatch),
        ClaimOutcome::Claimed { .. } => Some(Outcome::Claimed),
    }
}

/// Why a claim does not run the handler.
enum Refused {
    /// Answered at once: a replay, `422`, `503`.
    Answer(Settled, Response),
    /// Another request holds the key; the store's time until its lease runs out.
    InProgress(Duration),
}

/// What a claim attempt answers when it panicked outside the handler (which has its
/// own guard) or was cut off by the runtime shutting down.
fn interrupted<X>() -> Attempt<X> {
    Attempt::Done(
        Settled::Failed,
        internal_error("The request was interrupted; it is safe to retry with the same key."),
    )
}

/// The store operation `call`, started at `started`: failed with [`StoreError::Timeout`]
/// when it is not done `timeout` after `started`, and timed into the store-operation
/// metrics (a call dropped before it finished records nothing). A call done at its
/// first poll arms no timer ([`ByDeadline`]).
///
/// [`StoreError::Timeout`]: crate::StoreError::Timeout
fn store_call<T>(
    operation: StoreOperation,
    started: tokio::time::Instant,
    timeout: Duration,
    call: impl Future<Output = Result<T, crate::StoreError>>,
) -> impl Future<Output = Result<T, crate::StoreError>> {
    timed_store_call(operation, started, timeout, call).map(|(result, _)| result)
}

/// [`store_call`], and when the store answered: the clock read that times the call,
/// for a caller that needs the time next (the claim's answer starts the handler's run).
fn timed_store_call<T>(
    operation: StoreOperation,
    started: tokio::time::Instant,
    timeout: Duration,
    call: impl Future<Output = Result<T, crate::StoreError>>,
) -> impl Future<Output = (Result<T, crate::StoreError>, tokio::time::Instant)> {
    bounded_from(started, timeout, call).map(move |result| {
        let answered = tokio::time::Instant::now();
        metrics::store_operation(operation, result.is_ok(), answered - started);
        (result, answered)
    })
}

/// `operation`, failed with [`StoreError::Timeout`](crate::StoreError::Timeout) when it takes longer than `timeout`.
fn bounded<T>(
    timeout: Duration,
    operation: impl Future<Output = Result<T, crate::StoreError>>,
) -> impl Future<Output = Result<T, crate::StoreError>> {
    bounded_from(tokio::time::Instant::now(), timeout, operation)
}

/// `operation`, failed with [`StoreError::Timeout`](crate::StoreError::Timeout) when it is not done `timeout` after
/// `started`.
fn bounded_from<T>(
    started: tokio::time::Instant,
    timeout: Duration,
    operation: impl Future<Output = Result<T, crate::StoreError>>,
) -> impl Future<Output = Result<T, crate::StoreError>> {
    ByDeadline::new(started + timeout, operation)
        .map(move |output| output.unwrap_or(Err(crate::StoreError::Timeout(timeout))))
}
