//! A complete store written outside the crate against the fenced record seam: records in
//! a `Mutex<BTreeMap>`, changed only by compare-and-set on their version, with every
//! protocol decision left to [`Fenced`]. It passes the whole conformance suite, which is
//! what a store of any other database needs to do as well.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idempotent_runtime::clock::{Clock, ManualClock};
use idempotent_runtime::store::{
    Capabilities, Change, ClaimRequest, Fenced, Inserted, KeyedRecord, Record, RecordStore,
    StoreNow, Updated,
};
use idempotent_runtime::testing::Trial;
use idempotent_runtime::testing::conformance::{self, Harness, RecordsHarness};
use idempotent_runtime::{Store, StoreError};

/// Records by `(scope, key)`.
type Records = BTreeMap<(String, String), Record>;

/// Records by `(scope, key)`, on a clock of this process.
#[derive(Debug)]
struct BTreeRecords {
    records: Mutex<Records>,
    clock: Arc<dyn Clock>,
}

impl BTreeRecords {
    fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            records: Mutex::new(BTreeMap::new()),
            clock,
        }
    }

    /// The map, and the instant of the operation about to run on it.
    fn lock(&self) -> (MutexGuard<'_, Records>, StoreNow) {
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let now = StoreNow {
            wall_millis: self.clock.now_millis(),
            lease_millis: self.clock.monotonic_millis(),
        };
        (records, now)
    }
}

fn id(scope: &str, key: &str) -> (String, String) {
    (scope.to_owned(), key.to_owned())
}

#[async_trait::async_trait]
impl RecordStore for BTreeRecords {
    async fn insert(&self, claim: &ClaimRequest<'_>) -> Result<Inserted, StoreError> {
        let (mut records, now) = self.lock();
        if let Some(record) = records.get(&id(claim.scope, claim.key)) {
            return Ok(Inserted::Exists(record.clone(), now));
        }
        records.insert(id(claim.scope, claim.key), Record::claimed(claim, now));
        Ok(Inserted::Inserted)
    }

    async fn read(&self, scope: &str, key: &str) -> Result<(Option<Record>, StoreNow), StoreError> {
        let (records, now) = self.lock();
        Ok((records.get(&id(scope, key)).cloned(), now))
    }

    async fn update(
        &self,
        scope: &str,
        key: &str,
        version: u64,
        change: &Change<'_>,
    ) -> Result<Updated, StoreError> {
        let (mut records, now) = self.lock();
        match records.get_mut(&id(scope, key)) {
            Some(record) if record.version == version => {
                *record = record.changed(change, now);
                Ok(Updated::Updated(record.version))
            }
            current => Ok(Updated::Stale(current.cloned(), now)),
        }
    }

    async fn delete(&self, scope: &str, key: &str, version: u64) -> Result<bool, StoreError> {
        let (mut records, _) = self.lock();
        let id = id(scope, key);
        let matches = records.get(&id).is_some_and(|r| r.version == version);
        if matches {
            records.remove(&id);
        }
        Ok(matches)
    }

    async fn past_expiry(&self, limit: u32) -> Result<(Vec<KeyedRecord>, StoreNow), StoreError> {
        let (records, now) = self.lock();
        let past = records
            .iter()
            .filter(|(_, record)| record.expires_at <= now.wall_millis)
            .take(limit as usize)
            .map(|((scope, key), record)| KeyedRecord {
                scope: scope.clone(),
                key: key.clone(),
                record: record.clone(),
            })
            .collect();
        Ok((past, now))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
            .with_clock(self.clock.clone())
            .in_process()
    }
}

/// A fresh [`BTreeRecords`] behind [`Fenced`], on a [`ManualClock`].
struct FencedBTreeHarness {
    store: Arc<Fenced<BTreeRecords>>,
    clock: ManualClock,
}

#[async_trait::async_trait]
impl Harness for FencedBTreeHarness {
    async fn new() -> Self {
        let clock = ManualClock::at_millis(1_700_000_000_000);
        let store = Arc::new(Fenced::new(BTreeRecords::new(Arc::new(clock.clone()))));
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

impl RecordsHarness for FencedBTreeHarness {
    fn records(&self) -> &dyn RecordStore {
        self.store.records()
    }
}

pub(crate) fn trials() -> Vec<Trial> {
    let mut trials = conformance::trials::<FencedBTreeHarness>();
    trials.extend(conformance::record_trials::<FencedBTreeHarness>());
    trials
}
