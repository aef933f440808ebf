//! The engine's replay cache: replays and `422`s answered without the store, filled from
//! this process's completions and from the store's replays, never past a record's TTL or
//! the cache's maximum age, and never holding what is not a completed record.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use axum::response::Response;
use http::StatusCode;
use http_body_util::BodyExt;
use idempotent_runtime::clock::ManualClock;
use idempotent_runtime::engine::ReplayCacheConfig;
use idempotent_runtime::store::{Capabilities, ClaimAnswer, Forward, MemoryStore};
use idempotent_runtime::store::{ClaimRequest, FencingToken, StoredResponse};
use idempotent_runtime::{
    Fingerprint, ForgetOutcome, HandlerConfig, Idempotency, OnServerError, Store, StoreError,
};

const CONFIG: HandlerConfig = HandlerConfig::new().ttl(Duration::from_secs(600));

fn fingerprint(n: u8) -> Fingerprint {
    Fingerprint {
        version: 1,
        digest: [n; 32],
    }
}

/// A memory store that counts the claims it is asked for. `forward_expiry`,
/// `forward_clock` and `forward_in_process` say whether it passes on what the memory store
/// tells the replay cache (a decorator that does not still works: uncached, or caching
/// every completion).
#[derive(Debug)]
struct Counting {
    inner: MemoryStore,
    claims: AtomicUsize,
    forward_expiry: bool,
    forward_clock: bool,
    forward_in_process: bool,
    /// How many completions to fail (as a store timeout) before passing them on.
    fail_completes: AtomicUsize,
    /// Answer every completion "not yours" (a lease taken over meanwhile).
    deny_complete: AtomicBool,
}

impl Counting {
    fn new(inner: MemoryStore) -> Arc<Self> {
        Arc::new(Self {
            inner,
            claims: AtomicUsize::new(0),
            forward_expiry: true,
            forward_clock: true,
            forward_in_process: false,
            fail_completes: AtomicUsize::new(0),
            deny_complete: AtomicBool::new(false),
        })
    }

    fn claims(&self) -> usize {
        self.claims.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Forward for Counting {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }
    async fn claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimAnswer, StoreError> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        let mut answer = self.inner.claim(claim).await?;
        answer.replay_lives_for = answer.replay_lives_for.filter(|_| self.forward_expiry);
        Ok(answer)
    }
    async fn complete(
        &self,
        s: &str,
        k: &str,
        t: FencingToken,
        r: &StoredResponse,
    ) -> Result<bool, StoreError> {
        if self.fail_completes.load(Ordering::SeqCst) > 0 {
            self.fail_completes.fetch_sub(1, Ordering::SeqCst);
            return Err(StoreError::Timeout(Duration::from_millis(1)));
        }
        if self.deny_complete.load(Ordering::SeqCst) {
            return Ok(false);
        }
        self.inner.complete(s, k, t, r).await
    }
    fn capabilities(&self) -> Capabilities {
        let mut offered = self.inner.capabilities();
        offered.clock = offered.clock.filter(|_| self.forward_clock);
        offered.in_process &= self.forward_in_process;
        offered
    }
}

/// Runs one request for `(alice, key)` with `fp`; the handler counts its runs into `runs`
/// and answers `status`.
async fn request(
    engine: &Idempotency,
    config: &HandlerConfig,
    key: &str,
    fp: u8,
    runs: &Arc<AtomicUsize>,
    status: StatusCode,
) -> Response {
    let runs = runs.clone();
    engine
        .run(config, "alice", key, fingerprint(fp), move |_| async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            (status, format!("run {n}"))
        })
        .await
}

async fn body(response: Response) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn replayed(response: &Response) -> bool {
    response.headers().get("idempotent-replayed").is_some()
}

/// An engine over `store` whose cache takes this process's completions.
fn caching_completions(store: Arc<Counting>) -> Idempotency {
    Idempotency::builder_shared(store)
        .replay_cache(Some(ReplayCacheConfig::new().remember_completions(true)))
        .build()
}

/// By default a completion is not copied into the cache: a key's first replay asks the
/// store, and the cache answers the ones after it (and the key's `422`s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_the_first_replay_asks_the_store_and_the_cache_answers_the_rest() {
    let store = Counting::new(MemoryStore::new());
    assert!(!Store::capabilities(&*store).in_process);
    let engine = Idempotency::builder_shared(store.clone()).build();
    let runs = Arc::new(AtomicUsize::new(0));

    let first = request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(store.claims(), 1);
    let replay = request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
    assert!(replayed(&replay));
    assert_eq!(store.claims(), 2, "the first replay asked the store");
    for _ in 0..3 {
        let again = request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
        assert!(replayed(&again));
        assert_eq!(body(again).await, "run 1");
    }
    let other = request(&engine, &CONFIG, "k", 2, &runs, StatusCode::CREATED).await;
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        store.claims(),
        2,
        "later replays and the 422 from the cache"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_and_mismatches_of_own_completions_skip_the_store() {
    let store = Counting::new(MemoryStore::new());
    let engine = caching_completions(store.clone());
    let runs = Arc::new(AtomicUsize::new(0));

    let first = request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(store.claims(), 1);
    for _ in 0..3 {
        let again = request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
        assert_eq!(again.status(), StatusCode::CREATED);
        assert!(replayed(&again));
        assert_eq!(body(again).await, "run 1");
    }
    let other = request(&engine, &CONFIG, "k", 2, &runs, StatusCode::CREATED).await;
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(store.claims(), 1, "answered from the cache");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Another scope, or another key, is not the cached record.
    let elsewhere = engine
        .run(&CONFIG, "bob", "k", fingerprint(1), |_| async {
            StatusCode::ACCEPTED
        })
        .await;
    assert_eq!(elsewhere.status(), StatusCode::ACCEPTED);
    assert_eq!(store.claims(), 2);
}

/// Over a store that keeps its records in memory, a completion is not copied into the
/// cache; the first replay asks the store, and the cache answers the ones after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_an_in_process_store_only_replayed_records_are_cached() {
    let store = Arc::new(Counting {
        forward_in_process: true,
        ..Arc::into_inner(Counting::new(MemoryStore::new())).unwrap()
    });
    assert!(Store::capabilities(&*store).in_process);
    // Even when asked to take completions.
    let engine = caching_completions(store.clone());
    let runs = Arc::new(AtomicUsize::new(0));

    let first = request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let other = request(&engine, &CONFIG, "k", 2, &runs, StatusCode::CREATED).await;
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        store.claims(),
        2,
        "the completion was not cached: the store answered"
    );
    for _ in 0..3 {
        let again = request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
        assert!(replayed(&again));
        assert_eq!(body(again).await, "run 1");
    }
    assert_eq!(
        store.claims(),
        3,
        "one replay from the store, then the cache"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instance_caches_the_replays_its_store_answers() {
    let shared = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let a = Idempotency::new(shared.clone());
    let b_store = Counting::new(shared);
    let b = Idempotency::builder_shared(b_store.clone()).build();

    let first = request(&a, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    for _ in 0..3 {
        let replay = request(&b, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
        assert!(replayed(&replay));
        assert_eq!(body(replay).await, "run 1");
    }
    assert_eq!(b_store.claims(), 1, "one store replay, then the cache");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_bound_its_replays_is_not_cached_from() {
    let shared = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let a = Idempotency::new(shared.clone());
    let b_store = Arc::new(Counting {
        forward_expiry: false,
        forward_clock: false,
        ..Arc::into_inner(Counting::new(shared)).unwrap()
    });
    let b = Idempotency::builder_shared(b_store.clone()).build();
    request(&a, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
    for n in 1..=3 {
        let replay = request(&b, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
        assert!(replayed(&replay));
        assert_eq!(b_store.claims(), n);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_end_with_the_record_ttl_and_the_maximum_age() {
    let clock = ManualClock::new();
    let store = Counting::new(MemoryStore::with_clock(Arc::new(clock.clone())));
    let engine = Idempotency::builder_shared(store.clone())
        .replay_cache(Some(
            ReplayCacheConfig::new()
                .max_age(Duration::from_secs(30))
                .remember_completions(true),
        ))
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    let short = HandlerConfig::new().ttl(Duration::from_secs(20));

    // The record's TTL (20 s) ends before the cache's maximum age (30 s): past it, the
    // key is new to the store and to the cache, whatever the body.
    request(&engine, &short, "short", 1, &runs, StatusCode::CREATED).await;
    clock.advance(Duration::from_secs(19));
    let replay = request(&engine, &short, "short", 1, &runs, StatusCode::CREATED).await;
    assert!(replayed(&replay));
    assert_eq!(store.claims(), 1);
    clock.advance(Duration::from_secs(1));
    let anew = request(&engine, &short, "short", 2, &runs, StatusCode::CREATED).await;
    assert_eq!(anew.status(), StatusCode::CREATED);
    assert!(!replayed(&anew), "expired: treated as new");
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // A long TTL: the maximum age sends the replay back to the store, which refills.
    request(&engine, &CONFIG, "long", 1, &runs, StatusCode::CREATED).await;
    let claims = store.claims();
    clock.advance(Duration::from_secs(29));
    request(&engine, &CONFIG, "long", 1, &runs, StatusCode::CREATED).await;
    assert_eq!(store.claims(), claims, "still cached");
    clock.advance(Duration::from_secs(1));
    let replay = request(&engine, &CONFIG, "long", 1, &runs, StatusCode::CREATED).await;
    assert!(replayed(&replay));
    assert_eq!(
        store.claims(),
        claims + 1,
        "past the maximum age: the store"
    );
    request(&engine, &CONFIG, "long", 1, &runs, StatusCode::CREATED).await;
    assert_eq!(store.claims(), claims + 1, "cached again");

    // A replay the store answered is cached no longer than the record's remaining life.
    let other = Idempotency::builder_shared(store.clone()).build();
    request(&engine, &short, "late", 1, &runs, StatusCode::CREATED).await;
    clock.advance(Duration::from_secs(15));
    let replay = request(&other, &short, "late", 1, &runs, StatusCode::CREATED).await;
    assert!(replayed(&replay));
    clock.advance(Duration::from_secs(5));
    let anew = request(&other, &short, "late", 2, &runs, StatusCode::CREATED).await;
    assert!(!replayed(&anew), "the record expired 20 s after its claim");
    assert_eq!(anew.status(), StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_cached_sends_the_key_back_to_the_store() {
    let store = Counting::new(MemoryStore::new());
    let engine = caching_completions(store.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
    request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
    assert_eq!(store.claims(), 1);
    engine.forget_cached("alice", "k");
    engine.forget_cached("alice", "never-seen");
    let replay = request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
    assert!(replayed(&replay));
    assert_eq!(store.claims(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_drops_the_cached_copy_so_the_key_runs_as_new() {
    let store = Counting::new(MemoryStore::new());
    let engine = caching_completions(store.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
    let cached = request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
    assert!(replayed(&cached));
    assert_eq!(store.claims(), 1);
    let forgotten = engine.forget("alice", "k", false).await.expect("forget");
    assert!(
        matches!(forgotten, ForgetOutcome::Forgotten(_)),
        "{forgotten:?}"
    );
    let again = request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
    assert!(
        !replayed(&again),
        "a forgotten key runs as new, not from the cache"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(store.claims(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_and_in_progress_claims_are_never_cached() {
    let store = Counting::new(MemoryStore::new());
    let engine = caching_completions(store.clone());
    let runs = Arc::new(AtomicUsize::new(0));

    // A released 5xx: the retry runs the handler again.
    let failed = request(&engine, &CONFIG, "k", 1, &runs, StatusCode::BAD_GATEWAY).await;
    assert_eq!(failed.status(), StatusCode::BAD_GATEWAY);
    let retried = request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
    assert_eq!(retried.status(), StatusCode::CREATED);
    assert!(!replayed(&retried));
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // A stored 5xx is a completed record like any other.
    let store_5xx = CONFIG.on_server_error(OnServerError::Store);
    request(
        &engine,
        &store_5xx,
        "kept",
        1,
        &runs,
        StatusCode::BAD_GATEWAY,
    )
    .await;
    let claims = store.claims();
    let replay = request(&engine, &store_5xx, "kept", 1, &runs, StatusCode::CREATED).await;
    assert_eq!(replay.status(), StatusCode::BAD_GATEWAY);
    assert!(replayed(&replay));
    assert_eq!(store.claims(), claims);

    // While the original runs, duplicates ask the store (409) every time.
    let gate = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(tokio::sync::Notify::new());
    let original = {
        let (engine, gate, started) = (engine.clone(), gate.clone(), started.clone());
        tokio::spawn(async move {
            engine
                .run(
                    &CONFIG,
                    "alice",
                    "slow",
                    fingerprint(1),
                    move |_| async move {
                        started.notify_one();
                        gate.notified().await;
                        StatusCode::CREATED
                    },
                )
                .await
        })
    };
    started.notified().await;
    let claims = store.claims();
    for n in 1..=2 {
        let busy = request(&engine, &CONFIG, "slow", 1, &runs, StatusCode::CREATED).await;
        assert_eq!(busy.status(), StatusCode::CONFLICT);
        assert_eq!(store.claims(), claims + n);
    }
    gate.notify_one();
    assert_eq!(original.await.unwrap().status(), StatusCode::CREATED);
    let replay = request(&engine, &CONFIG, "slow", 1, &runs, StatusCode::CREATED).await;
    assert!(replayed(&replay));
    assert_eq!(store.claims(), claims + 2, "completed: cached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_cache_every_replay_asks_the_store() {
    let store = Counting::new(MemoryStore::new());
    let engine = Idempotency::builder_shared(store.clone())
        .replay_cache(None)
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    for n in 1..=3 {
        request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
        assert_eq!(store.claims(), n);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Many concurrent duplicates, on real threads, while the cache fills: one execution,
/// every answer the original's or a `409`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_run_once_while_the_cache_fills() {
    let engine = Idempotency::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    for round in 0..20 {
        let key = format!("k{round}");
        let requests: Vec<_> = (0..50)
            .map(|_| {
                let (engine, runs, key) = (engine.clone(), runs.clone(), key.clone());
                tokio::spawn(async move {
                    let response =
                        request(&engine, &CONFIG, &key, 1, &runs, StatusCode::CREATED).await;
                    let status = response.status();
                    (status, body(response).await)
                })
            })
            .collect();
        for handle in requests {
            let (status, body) = handle.await.unwrap();
            assert!(
                status == StatusCode::CONFLICT
                    || (status == StatusCode::CREATED && body.starts_with("run ")),
                "{status} {body}"
            );
        }
        assert_eq!(runs.load(Ordering::SeqCst), round + 1);
    }
}

/// A completion the store accepted only at a later attempt is cached all the same: the
/// record moves into the cache after the last attempt, inline or in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_recorded_by_a_retry_is_cached() {
    // 2 failures: recorded by the third inline attempt; 6: by the background retries,
    // after the client got its answer.
    for failures in [2, 6] {
        let store = Counting::new(MemoryStore::new());
        store.fail_completes.store(failures, Ordering::SeqCst);
        let engine = caching_completions(store.clone());
        let runs = Arc::new(AtomicUsize::new(0));
        let first = request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
        assert_eq!(first.status(), StatusCode::CREATED);
        assert!(
            engine.drain(Duration::from_secs(30)).await,
            "recorded in time"
        );
        assert_eq!(store.fail_completes.load(Ordering::SeqCst), 0, "{failures}");
        let again = request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
        assert!(replayed(&again), "{failures}");
        assert_eq!(
            store.claims(),
            1,
            "{failures} failures: replayed from the cache"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

/// A completion the store refused (the claim was taken over meanwhile) records nothing,
/// so nothing is cached: the next request asks the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_the_store_refused_is_not_cached() {
    let store = Counting::new(MemoryStore::new());
    store.deny_complete.store(true, Ordering::SeqCst);
    let engine = caching_completions(store.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let first = request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(engine.drain(Duration::from_secs(10)).await);
    let again = request(&engine, &CONFIG, "k", 1, &runs, StatusCode::CREATED).await;
    assert!(
        !replayed(&again),
        "not replayed from a record that was never kept"
    );
    assert_eq!(store.claims(), 2, "the second request asked the store");
}
