//! Faults at the store seam: a [`Faulty`] store wraps any [`Store`] and delays an
//! operation's answer *after* the inner store applied it, stalls an operation before it
//! reaches the store, or fails one after it was applied — what a slow network, an
//! overloaded runtime or a database waiting on a lock does to the engine.
//!
//! It is a [`Forward`] decorator: every other method, and every capability (clock,
//! in-process, transactions, watch), is the inner store's, so the engine treats a
//! `Faulty` store exactly like the store inside.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use idempotent_runtime::store::MemoryStore;
//! use idempotent_runtime::testing::faults::{Fault, Faulty, Operation};
//!
//! let store = Arc::new(MemoryStore::new());
//! let faulty = Faulty::new(store.clone());
//! // The next claim is applied at once, but its answer arrives 1.2 s later.
//! faulty.inject(Operation::Claim, Fault::DelayAnswer(Duration::from_millis(1200)));
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::store::{
    ClaimAnswer, ClaimRequest, FencingToken, Forward, RecordedStep, Store, StoreError,
    StoredResponse,
};

/// The store operation a [`Fault`] applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// `claim`.
    Claim,
    /// `renew`.
    Renew,
    /// `complete`.
    Complete,
    /// `release`.
    Release,
    /// `record_step`.
    RecordStep,
}

/// What happens to an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Applied by the inner store at once; the answer reaches the caller this much
    /// later (a slow link or runtime: the effect is there before the caller knows).
    DelayAnswer(Duration),
    /// Held this long before it reaches the inner store (a store waiting on a lock).
    Stall(Duration),
    /// Never answers and never reaches the inner store (the caller's timeout decides).
    Hang,
    /// Applied by the inner store, then answered with an error (a commit whose
    /// acknowledgement was lost).
    FailAfterApplying,
    /// Answered with an error without reaching the inner store.
    Fail,
}

/// A store decorator that injects [`Fault`]s into chosen operations; see the module docs.
#[derive(Debug)]
pub struct Faulty {
    inner: Arc<dyn Store>,
    /// Per operation: the fault and how many more calls it applies to (`None`: all).
    faults: Mutex<HashMap<Operation, (Fault, Option<u32>)>>,
}

impl Faulty {
    /// `inner`, with no faults yet.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            faults: Mutex::new(HashMap::new()),
        }
    }

    /// The next call of `operation` gets `fault` (later ones run normally).
    pub fn inject(&self, operation: Operation, fault: Fault) {
        self.set(operation, fault, Some(1));
    }

    /// Every call of `operation` gets `fault` until [`heal`](Self::heal).
    pub fn inject_always(&self, operation: Operation, fault: Fault) {
        self.set(operation, fault, None);
    }

    /// Removes every fault.
    pub fn heal(&self) {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    fn set(&self, operation: Operation, fault: Fault, times: Option<u32>) {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(operation, (fault, times));
    }

    /// The fault for this call of `operation`, if any (one use counted).
    fn take(&self, operation: Operation) -> Option<Fault> {
        let mut faults = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        let (fault, times) = faults.get_mut(&operation)?;
        let fault = *fault;
        if let Some(left) = times {
            *left -= 1;
            if *left == 0 {
                faults.remove(&operation);
            }
        }
        Some(fault)
    }

    /// Runs `call` on the inner store under this call's fault for `operation`.
    async fn faulted<T>(
        &self,
        operation: Operation,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let injected = || StoreError::backend(std::io::Error::other("injected fault"));
        match self.take(operation) {
            None => call.await,
            Some(Fault::DelayAnswer(by)) => {
                let answer = call.await;
                tokio::time::sleep(by).await;
                answer
            }
            Some(Fault::Stall(by)) => {
                tokio::time::sleep(by).await;
                call.await
            }
            Some(Fault::Hang) => std::future::pending().await,
            Some(Fault::FailAfterApplying) => {
                let _ = call.await;
                Err(injected())
            }
            Some(Fault::Fail) => Err(injected()),
        }
    }
}

#[async_trait]
impl Forward for Faulty {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimAnswer, StoreError> {
        self.faulted(Operation::Claim, self.inner.claim(claim))
            .await
    }

    async fn renew(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        lease: Duration,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.faulted(
            Operation::Renew,
            self.inner.renew(scope, key, token, lease, ttl),
        )
        .await
    }

    async fn complete(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        let call = self.inner.complete(scope, key, token, response);
        self.faulted(Operation::Complete, call).await
    }

    async fn release(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        self.faulted(Operation::Release, self.inner.release(scope, key, token))
            .await
    }

    async fn record_step(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        step: &RecordedStep,
    ) -> Result<bool, StoreError> {
        let call = self.inner.record_step(scope, key, token, step);
        self.faulted(Operation::RecordStep, call).await
    }
}
