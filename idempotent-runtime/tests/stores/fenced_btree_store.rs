//! A complete store written outside the crate against the fenced record seam: records in
//! a `Mutex<BTreeMap>`, changed only by compare-and-set on their version, with every
//! protocol decision left to [`Fenced`]. It passes the whole conformance suite, which is
//! what a store of any other database needs to do as well.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idempotent_runtime::clock::{Clock, ManualClock};
use idempotent_runtime::fenced::Fenced;
use idempotent_runtime::store::{
    Capabilities, Change, ClaimOutcome, ClaimRequest, Inserted, KeyedRecord, Record, RecordStore,
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
    /// How many inserts to come answer [`Inserted::Gone`] without writing, as a store
    /// whose record vanished between its insert and its read does.
    vanishing: AtomicUsize,
}

impl BTreeRecords {
    fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            records: Mutex::new(BTreeMap::new()),
            clock,
            vanishing: AtomicUsize::new(0),
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
        let vanished = self
            .vanishing
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1));
        if vanished.is_ok() {
            return Ok(Inserted::Gone);
        }
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

/// A record that vanished under an insert (`Inserted::Gone`) sends the claim back to an
/// insert, decided by `Fenced` and not by the store, until one lands.
async fn an_insert_that_finds_its_record_gone_inserts_again() {
    let harness = FencedBTreeHarness::new().await;
    harness.store.records().vanishing.store(5, SeqCst);
    let fingerprint = idempotent_runtime::Fingerprint {
        version: 1,
        digest: [3; 32],
    };
    let token = idempotent_runtime::store::FencingToken::random();
    let claim = ClaimRequest {
        scope: "acct_alice",
        key: "k",
        fingerprint: &fingerprint,
        ttl: Duration::from_secs(60),
        lease: Duration::from_secs(10),
        token,
    };
    let answer = harness.store.claim(&claim).await.expect("the claim");
    assert!(
        matches!(answer.outcome, ClaimOutcome::Claimed { token: won, .. } if won == token),
        "{answer:?}"
    );
    assert_eq!(harness.store.records().vanishing.load(SeqCst), 0);
    let (record, _) = harness
        .store
        .records()
        .read("acct_alice", "k")
        .await
        .unwrap();
    assert_eq!(record.map(|record| record.token), Some(token));
}

pub(crate) fn trials() -> Vec<Trial> {
    let mut trials = conformance::trials::<FencedBTreeHarness>();
    trials.extend(conformance::record_trials::<FencedBTreeHarness>());
    trials.push(idempotent_runtime::testing::async_trial(
        "fenced_btree_store::an_insert_that_finds_its_record_gone_inserts_again",
        an_insert_that_finds_its_record_gone_inserts_again,
    ));
    trials
}
