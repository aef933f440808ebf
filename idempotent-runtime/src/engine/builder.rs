//! [`IdempotencyBuilder`]: an engine's configuration, starting from the published
//! defaults ([`super::policy`]).

use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use http::HeaderName;

use super::policy::{DEFAULT_LEASE, DEFAULT_MAX_DURATION, DEFAULT_MAX_STORED_BODY, DEFAULT_TTL};
use super::replay_cache::{ReplayCache, ReplayCacheConfig};
use super::sweeper::SweepPace;
use super::{Idempotency, Inner, retry_after};
use crate::metrics;
use crate::problem::Problem;
use crate::rendering::ProblemRenderer;
use crate::store::Store;

/// Configures an [`Idempotency`] engine.
#[derive(Debug)]
pub struct IdempotencyBuilder {
    inner: Inner,
    replay_cache: Option<ReplayCacheConfig>,
}

impl IdempotencyBuilder {
    /// A builder over `store` with the default policy.
    pub(super) fn new(store: Arc<dyn Store>) -> Self {
        IdempotencyBuilder {
            inner: Inner {
                capabilities: store.capabilities(),
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
                sweep_pace: SweepPace::DEFAULT,
                problems: ProblemRenderer::default(),
            },
            replay_cache: Some(ReplayCacheConfig::new()),
        }
    }

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
    /// and [`IdempotencyKey::lease_lost`](crate::key::IdempotencyKey::lease_lost) turns true
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
    /// allows: the engine releases it and answers `503` (see [`crate::key::IdempotencyKey::lease_lost`]
    /// for the same rule while the handler runs).
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.inner.store_timeout = timeout;
        self
    }

    /// How long a duplicate that finds the original still running waits for its outcome,
    /// for handlers that set no `wait` (default: off, the duplicate gets `409` at once;
    /// a zero wait also means off). See
    /// [`HandlerConfig::wait`](crate::config::HandlerConfig::wait).
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

    /// How many expired records the sweeper ([`Idempotency::spawn_sweeper`]) deletes per
    /// store call (default 5000). Each call is one statement (two on MySQL: it finds the
    /// batch, then deletes it by primary key; on SQLite, writes of 100 records paced to
    /// half of the one writer's time) and one short transaction: a smaller batch holds
    /// its row locks for less time, so claims queued behind it wait less; a larger one
    /// costs fewer round trips per record. A sweep goes on until a call deletes fewer than
    /// a batch. Zero turns the sweeper's deletes off.
    pub fn sweep_batch(mut self, batch: u32) -> Self {
        self.inner.sweep_pace.batch = batch;
        self
    }

    /// How long the sweeper waits between two batches of one sweep (default: not at all),
    /// and [`Idempotency::purge_expired`] too. A pause paces a large backlog (after an
    /// outage, or the first sweep of a big table) so that it takes a bounded share of the
    /// database: at most [`sweep_batch`](Self::sweep_batch) records per pause, plus the
    /// time the deletes themselves take.
    pub fn sweep_pause(mut self, pause: Duration) -> Self {
        self.inner.sweep_pace.pause = pause;
        self
    }

    /// Renders the answers the library makes itself — a missing or invalid key (`400`),
    /// a request still in progress (`409`), a key reused (`422`), a body over the limit
    /// (`413`), the store unavailable (`503`), a webhook that fails verification (`401`),
    /// … — in the application's own error envelope instead of problem+json (the
    /// default). `render` gets the [`Problem`] (its `code` is the stable one in
    /// [`codes`](crate::problem::codes)) and makes the response's body.
    ///
    /// Whatever `render` returns, the answer keeps the library's status and headers
    /// (`Retry-After`, `Idempotent-Replayed`, `Location`, …; only `Content-Type` and
    /// `Content-Length` are the renderer's), since clients retry by them. It applies to
    /// every HTTP path: the attribute, the [layer](crate::IdempotencyLayer) (and its
    /// webhooks) and [`Idempotency::run`]. Not rendered: what a handler returns itself
    /// (a [`StepError`](crate::StepError) it answers with, an
    /// [`AsProblem`](crate::AsProblem) rejection), which the application renders as it
    /// likes, and a replay of a recorded answer, which is replayed as recorded.
    ///
    /// ```
    /// use axum::Json;
    /// use axum::response::IntoResponse;
    /// use idempotent_runtime::Idempotency;
    /// use idempotent_runtime::store::MemoryStore;
    ///
    /// let idempotency = Idempotency::builder(MemoryStore::new())
    ///     .render_problems(|problem| {
    ///         let body = serde_json::json!({
    ///             "error": { "code": problem.code, "message": problem.detail }
    ///         });
    ///         Json(body).into_response()
    ///     })
    ///     .build();
    /// # drop(idempotency);
    /// ```
    pub fn render_problems(
        mut self,
        render: impl Fn(Problem) -> Response + Send + Sync + 'static,
    ) -> Self {
        self.inner.problems = ProblemRenderer::new(render);
        self
    }

    /// Builds the engine (and [describes](crate::metrics::describe) its metrics to the
    /// recorder installed by then, if any).
    pub fn build(mut self) -> Idempotency {
        metrics::describe();
        self.inner.replay_cache = self.replay_cache.map(|config| {
            let offered = &self.inner.capabilities;
            ReplayCache::new(config, offered.clock.clone(), offered.in_process)
        });
        Idempotency {
            inner: Arc::new(self.inner),
        }
    }
}
