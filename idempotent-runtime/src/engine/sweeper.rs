//! Deleting expired records: once on demand, or periodically in a background task.

use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, warn};

use crate::metrics::{self, StoreOperation};
use crate::store::{Store, StoreError};

/// How the background sweeper deletes: how many records per store call, and how long it
/// waits between two calls of one sweep (see
/// [`IdempotencyBuilder::sweep_batch`](super::IdempotencyBuilder::sweep_batch) and
/// [`sweep_pause`](super::IdempotencyBuilder::sweep_pause)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SweepPace {
    pub(super) batch: u32,
    pub(super) pause: Duration,
}

impl SweepPace {
    /// The default pace: batches of 5000, no pause between them.
    pub(super) const DEFAULT: SweepPace = SweepPace {
        batch: 5000,
        pause: Duration::ZERO,
    };
}

/// Purges expired records in batches of `pace.batch`, waiting `pace.pause` after each
/// full batch, until fewer than a batch remain; returns how many were deleted.
pub(super) async fn purge_expired(store: &dyn Store, pace: SweepPace) -> Result<u64, StoreError> {
    if pace.batch == 0 {
        return Ok(0);
    }
    let mut total = 0;
    loop {
        let purged = store.purge_expired(pace.batch);
        let deleted = metrics::timed(StoreOperation::Purge, purged).await?;
        total += deleted;
        if deleted < u64::from(pace.batch) {
            return Ok(total);
        }
        if !pace.pause.is_zero() {
            tokio::time::sleep(pace.pause).await;
        }
    }
}

/// Spawns a task that purges expired records every `interval` at `pace`, until the
/// returned handle is aborted.
///
/// # Panics
///
/// On a zero `interval`.
pub(super) fn spawn_sweeper(
    store: Arc<dyn Store>,
    interval: Duration,
    pace: SweepPace,
) -> tokio::task::JoinHandle<()> {
    assert!(!interval.is_zero(), "the sweeper interval must be positive");
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            match purge_expired(store.as_ref(), pace).await {
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
