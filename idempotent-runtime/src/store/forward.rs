//! [`Forward`]: a store decorator (metrics, tracing, faults) overrides only the
//! operations it changes; everything else, capabilities included, reaches the inner
//! store, so a decorator cannot drop what its inner store offers by forgetting a method.

use std::time::Duration;

use async_trait::async_trait;

use super::capabilities::Capabilities;
use super::operator::{ForgetOutcome, RecordInfo};
use super::{
    ClaimAnswer, ClaimRequest, FencingToken, RecordedStep, Store, StoreError, StoredResponse,
};

/// A store that wraps another: every method forwards to [`inner`](Self::inner) unless
/// overridden, and every type implementing it is a [`Store`] (a blanket implementation),
/// so a decorator implements this trait instead of `Store`. Both traits name the same
/// operations: call them on a decorator through `Store` (or an `Arc<dyn Store>`, as the
/// engine does).
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// use idempotent_runtime::store::{ClaimAnswer, ClaimRequest, Forward, MemoryStore, Store, StoreError};
/// use idempotent_runtime::Idempotency;
///
/// /// Counts claims; everything else (renewals, completions, the inner store's clock,
/// /// transactions and change notifications) is the inner store's.
/// #[derive(Debug)]
/// struct CountingClaims<S> {
///     inner: S,
///     claims: AtomicU64,
/// }
///
/// #[async_trait::async_trait]
/// impl<S: Store> Forward for CountingClaims<S> {
///     fn inner(&self) -> &dyn Store {
///         &self.inner
///     }
///
///     async fn claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimAnswer, StoreError> {
///         self.claims.fetch_add(1, Ordering::Relaxed);
///         self.inner.claim(claim).await
///     }
/// }
///
/// let store = CountingClaims { inner: MemoryStore::new(), claims: AtomicU64::new(0) };
/// // Both traits name `capabilities`: ask through `Store`, as the engine does.
/// assert!(Store::capabilities(&store).in_process, "the memory store's pass through");
/// let engine = Idempotency::new(store);
/// ```
#[async_trait]
pub trait Forward: Send + Sync + std::fmt::Debug + 'static {
    /// The store every method that is not overridden forwards to.
    fn inner(&self) -> &dyn Store;

    /// [`Store::claim`]; forwards by default.
    async fn claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimAnswer, StoreError> {
        self.inner().claim(claim).await
    }

    /// [`Store::renew`]; forwards by default.
    async fn renew(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        lease: Duration,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.inner().renew(scope, key, token, lease, ttl).await
    }

    /// [`Store::complete`]; forwards by default.
    async fn complete(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        self.inner().complete(scope, key, token, response).await
    }

    /// [`Store::record_step`]; forwards by default.
    async fn record_step(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        step: &RecordedStep,
    ) -> Result<bool, StoreError> {
        self.inner().record_step(scope, key, token, step).await
    }

    /// [`Store::release`]; forwards by default.
    async fn release(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        self.inner().release(scope, key, token).await
    }

    /// [`Store::purge_expired`]; forwards by default.
    async fn purge_expired(&self, limit: u32) -> Result<u64, StoreError> {
        self.inner().purge_expired(limit).await
    }

    /// [`Store::inspect`]; forwards by default.
    async fn inspect(&self, scope: &str, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        self.inner().inspect(scope, key).await
    }

    /// [`Store::forget`]; forwards by default.
    async fn forget(
        &self,
        scope: &str,
        key: &str,
        force: bool,
    ) -> Result<ForgetOutcome, StoreError> {
        self.inner().forget(scope, key, force).await
    }

    /// [`Store::capabilities`]; the inner store's by default. A decorator that overrides
    /// it changes what the engine believes about the store (e.g. a test hiding a clock).
    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }
}

#[async_trait]
impl<T: Forward> Store for T {
    async fn claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimAnswer, StoreError> {
        Forward::claim(self, claim).await
    }

    async fn renew(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        lease: Duration,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        Forward::renew(self, scope, key, token, lease, ttl).await
    }

    async fn complete(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        Forward::complete(self, scope, key, token, response).await
    }

    async fn record_step(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        step: &RecordedStep,
    ) -> Result<bool, StoreError> {
        Forward::record_step(self, scope, key, token, step).await
    }

    async fn release(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        Forward::release(self, scope, key, token).await
    }

    async fn purge_expired(&self, limit: u32) -> Result<u64, StoreError> {
        Forward::purge_expired(self, limit).await
    }

    async fn inspect(&self, scope: &str, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        Forward::inspect(self, scope, key).await
    }

    async fn forget(
        &self,
        scope: &str,
        key: &str,
        force: bool,
    ) -> Result<ForgetOutcome, StoreError> {
        Forward::forget(self, scope, key, force).await
    }

    fn capabilities(&self) -> Capabilities {
        Forward::capabilities(self)
    }
}
