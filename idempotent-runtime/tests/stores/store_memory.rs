//! The conformance suite on [`MemoryStore`].

use std::sync::Arc;
use std::time::Duration;

use idempotent_runtime::Store;
use idempotent_runtime::clock::ManualClock;
use idempotent_runtime::store::{MemoryStore, RecordStore};
use idempotent_runtime::testing::Trial;
use idempotent_runtime::testing::conformance::{self, Harness, RecordsHarness};

/// A fresh [`MemoryStore`] on a [`ManualClock`]. It has no other store
/// ([`Harness::another_store`] is `None`): a second `MemoryStore` shares no records with
/// it, and the same store again would race only what the single-store checks race.
struct MemoryHarness {
    store: Arc<MemoryStore>,
    clock: ManualClock,
}

#[async_trait::async_trait]
impl Harness for MemoryHarness {
    async fn new() -> Self {
        let clock = ManualClock::at_millis(1_700_000_000_000);
        let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
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

impl RecordsHarness for MemoryHarness {
    fn records(&self) -> &dyn RecordStore {
        self.store.records()
    }
}

pub(crate) fn trials() -> Vec<Trial> {
    let mut trials = conformance::trials::<MemoryHarness>();
    trials.extend(conformance::record_trials::<MemoryHarness>());
    trials
}
