//! Deleting expired records: once on demand, or periodically in a background task.

use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, warn};

use crate::metrics::{self, StoreOperation};
use crate::store::{Store, StoreError};

/// How many records the background sweeper deletes per store call.
const SWEEP_BATCH: u32 = 1000;

/// Purges expired records in batches of `batch` until fewer than a batch remain;
/// returns how many were deleted.
pub(super) async fn purge_expired(store: &dyn Store, batch: u32) -> Result<u64, StoreError> {
    if batch == 0 {
        return Ok(0);
    }
    let mut total = 0;
    loop {
        let purged = store.purge_expired(batch);
        let deleted = metrics::timed(StoreOperation::Purge, purged).await?;
        total += deleted;
        if deleted < u64::from(batch) {
            return Ok(total);
        }
    }
}

/// Spawns a task that purges expired records every `interval`, in batches of
/// [`SWEEP_BATCH`], until the returned handle is aborted.
///
/// # Panics
///
/// On a zero `interval`.
pub(super) fn spawn_sweeper(
    store: Arc<dyn Store>,
    interval: Duration,
) -> tokio::task::JoinHandle<()> {
    assert!(!interval.is_zero(), "the sweeper interval must be positive");
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            match purge_expired(store.as_ref(), SWEEP_BATCH).await {
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
