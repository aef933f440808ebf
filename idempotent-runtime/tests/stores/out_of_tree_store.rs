//! A store written the way one outside this crate would be — only public API, features
//! `testing` — checked by the conformance suite in one line.
//!
//! `CountingStore` is a decorator (count every operation, forward it to an inner
//! store), the shape of a metrics or tracing layer. It is written on `Forward` and
//! overrides the counted operations only, so everything else its inner store offers —
//! the replay lives that let the engine cache replays, the clock those lives count on,
//! the change notifications a waiting duplicate wakes on, transactions — is still
//! there. The tests after the conformance suite show that it is: a hand-written
//! decorator that forwarded the operations alone lost all of it and still passed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use http::StatusCode;
use idempotent_runtime::clock::ManualClock;
use idempotent_runtime::store::{
    Capabilities, ClaimAnswer, ClaimWatch, Forward, MemoryStore, RecordedStep, WatchClaims,
};
use idempotent_runtime::store::{ClaimRequest, FencingToken, StoredResponse};
use idempotent_runtime::testing::conformance::{self, Harness};
use idempotent_runtime::testing::{Trial, async_trial};
use idempotent_runtime::{
    Fingerprint, ForgetOutcome, HandlerConfig, Idempotency, RecordInfo, Store, StoreError,
};
use tokio::sync::Notify;

/// Counts the operations it forwards to `inner`.
#[derive(Debug)]
struct CountingStore<S> {
    inner: S,
    operations: AtomicU64,
}

impl<S> CountingStore<S> {
    fn new(inner: S) -> Self {
        Self {
            inner,
            operations: AtomicU64::new(0),
        }
    }

    fn count(&self) {
        self.operations.fetch_add(1, Ordering::Relaxed);
    }

    fn operations(&self) -> u64 {
        self.operations.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl<S: Store> Forward for CountingStore<S> {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }

    async fn claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimAnswer, StoreError> {
        self.count();
        self.inner.claim(claim).await
    }

    async fn renew(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        lease: Duration,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.count();
        self.inner.renew(scope, key, token, lease, ttl).await
    }

    async fn complete(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        self.count();
        self.inner.complete(scope, key, token, response).await
    }

    async fn release(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        self.count();
        self.inner.release(scope, key, token).await
    }

    async fn record_step(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        step: &RecordedStep,
    ) -> Result<bool, StoreError> {
        self.count();
        self.inner.record_step(scope, key, token, step).await
    }

    async fn purge_expired(&self, limit: u32) -> Result<u64, StoreError> {
        self.count();
        self.inner.purge_expired(limit).await
    }

    async fn inspect(&self, scope: &str, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        self.count();
        self.inner.inspect(scope, key).await
    }

    async fn forget(
        &self,
        scope: &str,
        key: &str,
        force: bool,
    ) -> Result<ForgetOutcome, StoreError> {
        self.count();
        self.inner.forget(scope, key, force).await
    }
}

struct CountingHarness {
    store: Arc<CountingStore<MemoryStore>>,
    clock: ManualClock,
}

#[async_trait]
impl Harness for CountingHarness {
    async fn new() -> Self {
        let clock = ManualClock::new();
        let store = Arc::new(CountingStore::new(MemoryStore::with_clock(Arc::new(
            clock.clone(),
        ))));
        Self { store, clock }
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    async fn step_wall(&self, by_millis: i64) -> bool {
        self.clock.step_wall(by_millis);
        true
    }
}

const TTL: Duration = Duration::from_secs(600);
const FINGERPRINT: Fingerprint = Fingerprint {
    version: 1,
    digest: [1; 32],
};

/// Runs a request for `(alice, key)` whose handler counts its runs and answers `201`.
async fn request(
    engine: &Idempotency,
    config: &HandlerConfig,
    key: &str,
    runs: &Arc<AtomicUsize>,
) -> StatusCode {
    let runs = runs.clone();
    let answer = engine
        .run(config, "alice", key, FINGERPRINT, move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            StatusCode::CREATED
        })
        .await;
    answer.status()
}

/// The decorator keeps the memory store's replay lives, in-process flag and clock: the
/// engine's replay cache answers a key's replays after the first (which the in-process
/// store answers), with no operation reaching the store, and expires its copy when the
/// store's clock passes the TTL.
async fn replays_are_answered_from_the_engine_cache() {
    let clock = ManualClock::new();
    let store = Arc::new(CountingStore::new(MemoryStore::with_clock(Arc::new(
        clock.clone(),
    ))));
    let engine = Idempotency::builder_shared(store.clone()).build();
    let config = HandlerConfig::new().ttl(TTL);
    let runs = Arc::new(AtomicUsize::new(0));

    assert_eq!(
        request(&engine, &config, "k", &runs).await,
        StatusCode::CREATED
    );
    let before_first_replay = store.operations();
    assert_eq!(
        request(&engine, &config, "k", &runs).await,
        StatusCode::CREATED
    );
    assert!(
        store.operations() > before_first_replay,
        "the first replay asks the in-process store"
    );
    let cached = store.operations();
    for _ in 0..3 {
        assert_eq!(
            request(&engine, &config, "k", &runs).await,
            StatusCode::CREATED
        );
    }
    assert_eq!(
        store.operations(),
        cached,
        "later replays come from the engine's replay cache, not the store"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // The cache counts on the store's clock: past the TTL the key runs as new.
    clock.advance(TTL);
    assert_eq!(
        request(&engine, &config, "k", &runs).await,
        StatusCode::CREATED
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the cached copy expired with the record"
    );
}

/// Change notifications of the claims' ends: wakes every pending watch whenever a claim
/// completes or is released, and counts the watches started.
#[derive(Debug, Default)]
struct EndNotifications {
    ended: Arc<Notify>,
    watches: AtomicUsize,
}

impl WatchClaims for EndNotifications {
    fn watch_claim(&self, _scope: &str, _key: &str, _poll: Duration) -> ClaimWatch {
        self.watches.fetch_add(1, Ordering::SeqCst);
        // Created now, so a claim that ends before the engine awaits it still wakes it.
        Box::pin(self.ended.clone().notified_owned())
    }
}

/// A memory store that offers change notifications: the inner store of the waiting test.
#[derive(Debug)]
struct NotifyingStore {
    inner: MemoryStore,
    notifications: Arc<EndNotifications>,
}

#[async_trait]
impl Forward for NotifyingStore {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }

    async fn complete(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        let completed = self.inner.complete(scope, key, token, response).await;
        self.notifications.ended.notify_waiters();
        completed
    }

    async fn release(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        let released = self.inner.release(scope, key, token).await;
        self.notifications.ended.notify_waiters();
        released
    }

    fn capabilities(&self) -> Capabilities {
        self.inner
            .capabilities()
            .with_watch(self.notifications.clone())
    }
}

/// The decorator keeps its inner store's change notifications: a duplicate that waits on
/// another instance (an engine of its own, so no local wake-up) watches through them and
/// replays the original's answer once it completes.
async fn a_waiting_duplicate_watches_through_the_inner_store() {
    let notifications = Arc::new(EndNotifications::default());
    let store = Arc::new(CountingStore::new(NotifyingStore {
        inner: MemoryStore::new(),
        notifications: notifications.clone(),
    }));
    let (original_engine, duplicate_engine) = (
        Idempotency::builder_shared(store.clone()).build(),
        Idempotency::builder_shared(store.clone()).build(),
    );
    let config = HandlerConfig::new().ttl(TTL).wait(Duration::from_secs(60));
    let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let original = {
        let (started, finish) = (started.clone(), finish.clone());
        tokio::spawn(async move {
            original_engine
                .run(&config, "alice", "k", FINGERPRINT, move |_| async move {
                    started.notify_one();
                    finish.notified().await;
                    StatusCode::CREATED
                })
                .await
        })
    };
    started.notified().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let duplicate = {
        let runs = runs.clone();
        tokio::spawn(async move { request(&duplicate_engine, &config, "k", &runs).await })
    };
    let watching = async {
        while notifications.watches.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), watching)
        .await
        .expect("the duplicate watches through the inner store's notifications");
    finish.notify_one();
    assert_eq!(
        original.await.expect("original").status(),
        StatusCode::CREATED
    );
    assert_eq!(duplicate.await.expect("duplicate"), StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the duplicate replayed");
}

pub(crate) fn trials() -> Vec<Trial> {
    let mut trials = conformance::trials::<CountingHarness>();
    trials.push(async_trial(
        "forwarding::replays_are_answered_from_the_engine_cache",
        replays_are_answered_from_the_engine_cache,
    ));
    trials.push(async_trial(
        "forwarding::a_waiting_duplicate_watches_through_the_inner_store",
        a_waiting_duplicate_watches_through_the_inner_store,
    ));
    trials
}
