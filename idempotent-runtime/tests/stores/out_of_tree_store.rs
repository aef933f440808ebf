//! A store written the way one outside this crate would be — only public API, features
//! `testing` — checked by the conformance suite in one line.
//!
//! `CountingStore` is a decorator (count every operation, forward it to an inner
//! store), the shape of a metrics or tracing layer. It forwards `transactions()` too, so
//! it would support transactional handlers exactly like the store it wraps.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::testing::Trial;
use idempotent_runtime::testing::conformance::{self, Harness};
use idempotent_runtime::{
    ClaimOutcome, ClaimRequest, FencingToken, ForgetOutcome, ManualClock, RecordInfo, Store,
    StoreError, StoredResponse, TxSupport,
};

/// Counts the operations it forwards to `inner`.
#[derive(Debug)]
struct CountingStore<S> {
    inner: S,
    operations: AtomicU64,
}

impl<S> CountingStore<S> {
    fn count(&self) {
        self.operations.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl<S: Store> Store for CountingStore<S> {
    async fn try_claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.count();
        self.inner.try_claim(claim).await
    }

    async fn renew(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.count();
        self.inner.renew(scope, key, token, lease).await
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

    fn transactions(&self) -> Option<TxSupport> {
        self.inner.transactions()
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
        let store = Arc::new(CountingStore {
            inner: MemoryStore::with_clock(Arc::new(clock.clone())),
            operations: AtomicU64::new(0),
        });
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

pub(crate) fn trials() -> Vec<Trial> {
    conformance::trials::<CountingHarness>()
}
