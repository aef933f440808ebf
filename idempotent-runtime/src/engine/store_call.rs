//! Every store call the engine makes is bounded by a timeout and timed into the
//! store-operation metrics, here.

use std::time::Duration;

use futures_util::FutureExt;
use tokio::time::Instant;

use crate::metrics::{self, StoreOperation};
use crate::store::StoreError;

/// The store operation `call`, started at `started`: failed with [`StoreError::Timeout`]
/// when it is not done `timeout` after `started`, and timed into the store-operation
/// metrics (a call dropped before it finished records nothing).
pub(super) fn store_call<T>(
    operation: StoreOperation,
    started: Instant,
    timeout: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> impl Future<Output = Result<T, StoreError>> {
    timed_store_call(operation, started, timeout, call).map(|(result, _)| result)
}

/// [`store_call`], and when the store answered: the clock read that times the call,
/// for a caller that needs the time next (the claim's answer starts the handler's run).
pub(super) fn timed_store_call<T>(
    operation: StoreOperation,
    started: Instant,
    timeout: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> impl Future<Output = (Result<T, StoreError>, Instant)> {
    bounded_from(started, timeout, call).map(move |result| {
        let answered = Instant::now();
        metrics::store_operation(operation, result.is_ok(), answered - started);
        (result, answered)
    })
}

/// `operation`, failed with [`StoreError::Timeout`] when it takes longer than `timeout`.
pub(super) fn bounded<T>(
    timeout: Duration,
    operation: impl Future<Output = Result<T, StoreError>>,
) -> impl Future<Output = Result<T, StoreError>> {
    bounded_from(Instant::now(), timeout, operation)
}

/// `operation`, failed with [`StoreError::Timeout`] when it is not done `timeout` after
/// `started`.
fn bounded_from<T>(
    started: Instant,
    timeout: Duration,
    operation: impl Future<Output = Result<T, StoreError>>,
) -> impl Future<Output = Result<T, StoreError>> {
    tokio::time::timeout_at(started + timeout, operation)
        .map(move |output| output.unwrap_or(Err(StoreError::Timeout(timeout))))
}
