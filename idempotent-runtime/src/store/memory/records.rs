//! [`MemoryRecords`]: the fenced record register ([`RecordStore`]) in this process's
//! memory, one record per `(scope, key)` in a [`Sharded`] map, each changed in place
//! under its shard's lock by compare-and-set on its version.
//!
//! A record is kept in a compact form of its own (the response's headers encoded in one
//! allocation, [`CompactResponse`]), not as the seam's [`Record`]: a record outlives the
//! requests around it, and every allocation it holds is one more chunk in the way of
//! the allocator. The seam's record is made from it only for an answer that carries
//! one (a duplicate, a stale compare-and-set, the sweeper's candidates).

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use hashbrown::hash_table::Entry;

use crate::clock::{Clock, millis};
use crate::fingerprint::Fingerprint;
use crate::sharded::{Id, Identified, Sharded, Table};
use crate::store::record::CompactResponse;
use crate::store::{
    Capabilities, Change, ClaimRequest, FencingToken, Inserted, KeyedRecord, MemoryUsage, Record,
    RecordBody, RecordStore, StoreError, StoreNow, Updated,
};

/// How many independently locked tables hold the records.
pub(super) const SHARDS: usize = 32;

/// The records of a [`MemoryStore`](super::MemoryStore), on a clock of this process:
/// TTLs on its wall clock, leases on its monotonic one, so that a wall-clock step
/// cannot end a live lease.
#[derive(Debug)]
pub struct MemoryRecords {
    records: Sharded<Table<Held>>,
    clock: Arc<dyn Clock>,
}

/// One record as the map holds it: the seam's [`Record`] in compact form, with its id.
#[derive(Debug)]
pub(super) struct Held {
    id: Id,
    fingerprint: Fingerprint,
    token: FencingToken,
    version: u64,
    created_at: i64,
    expires_at: i64,
    body: HeldBody,
}

/// [`RecordBody`] in compact form.
#[derive(Debug)]
enum HeldBody {
    InProgress {
        lease_expires_at: i64,
        steps: Vec<u8>,
    },
    Completed(CompactResponse),
}

impl Identified for Held {
    fn id(&self) -> &Id {
        &self.id
    }
}

impl Held {
    /// The record a claim inserts, as the seam defines it ([`Record::claimed`]).
    fn inserted(id: Id, claim: &ClaimRequest<'_>, now: StoreNow) -> Self {
        let record = Record::claimed(claim, now);
        let body = match record.body {
            RecordBody::InProgress {
                lease_expires_at,
                steps,
            } => HeldBody::InProgress {
                lease_expires_at,
                steps: steps.to_vec(),
            },
            RecordBody::Completed(response) => HeldBody::Completed(CompactResponse::new(&response)),
        };
        Self {
            id,
            fingerprint: record.fingerprint,
            token: record.token,
            version: record.version,
            created_at: record.created_at,
            expires_at: record.expires_at,
            body,
        }
    }

    /// Applies `change` in place, bumping the version: what [`Record::changed`] makes of
    /// the record at `now()`, without copying what stays (a test holds the two alike).
    /// The clock is read only by a change that places something in time.
    fn apply(&mut self, change: &Change<'_>, now: impl FnOnce() -> StoreNow) {
        self.version = self.version.wrapping_add(1);
        match (*change, &mut self.body) {
            (Change::TakeOver { claim, keep_steps }, body) => {
                let now = now();
                let steps = match body {
                    HeldBody::InProgress { steps, .. } if keep_steps => std::mem::take(steps),
                    _ => Vec::new(),
                };
                self.fingerprint = *claim.fingerprint;
                self.token = claim.token;
                self.created_at = now.wall_millis;
                self.expires_at = now.wall_millis.saturating_add(millis(claim.ttl));
                self.body = HeldBody::InProgress {
                    lease_expires_at: now.lease_millis.saturating_add(millis(claim.lease)),
                    steps,
                };
            }
            (
                Change::Renew { lease, ttl },
                HeldBody::InProgress {
                    lease_expires_at, ..
                },
            ) => {
                let now = now();
                *lease_expires_at = now.lease_millis.saturating_add(millis(lease));
                self.expires_at = self
                    .expires_at
                    .max(now.wall_millis.saturating_add(millis(ttl)));
            }
            (Change::AppendStep(step), HeldBody::InProgress { steps, .. }) => {
                steps.extend_from_slice(step);
            }
            (Change::Complete(response), _) => {
                self.body = HeldBody::Completed(CompactResponse::new(response));
            }
            (
                Change::EndLease,
                HeldBody::InProgress {
                    lease_expires_at, ..
                },
            ) => {
                *lease_expires_at = now().lease_millis;
                self.token = FencingToken::RELEASED;
            }
            // A change of an in-progress record applied to a completed one changes
            // nothing but the version (the protocol never sends one).
            _ => {}
        }
    }

    /// The seam's record.
    fn record(&self) -> Result<Record, StoreError> {
        let body = match &self.body {
            HeldBody::InProgress {
                lease_expires_at,
                steps,
            } => RecordBody::InProgress {
                lease_expires_at: *lease_expires_at,
                steps: Bytes::copy_from_slice(steps),
            },
            HeldBody::Completed(response) => RecordBody::Completed(response.to_stored()?),
        };
        Ok(Record {
            fingerprint: self.fingerprint,
            token: self.token,
            version: self.version,
            created_at: self.created_at,
            expires_at: self.expires_at,
            body,
        })
    }

    /// The bytes it holds outside its table slot: scope and key, steps, stored headers
    /// and body.
    fn heap_bytes(&self) -> usize {
        self.id.id_bytes().len()
            + match &self.body {
                HeldBody::InProgress { steps, .. } => steps.len(),
                HeldBody::Completed(response) => response.heap_bytes(),
            }
    }
}

impl MemoryRecords {
    /// No records, on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            records: Sharded::new(SHARDS, Table::default),
            clock,
        }
    }

    /// Now, on both of the clock's timelines.
    fn now(&self) -> StoreNow {
        StoreNow {
            wall_millis: self.clock.now_millis(),
            lease_millis: self.clock.monotonic_millis(),
        }
    }

    /// How many records it holds (expired ones included until purged).
    pub fn len(&self) -> usize {
        self.records.each().map(|shard| shard.len()).sum()
    }

    /// Whether it holds no records.
    pub fn is_empty(&self) -> bool {
        self.records.each().all(|shard| shard.is_empty())
    }

    /// The records it holds and the heap bytes they take (see
    /// [`MemoryStore::memory_usage`](super::MemoryStore::memory_usage)).
    pub fn memory_usage(&self) -> MemoryUsage {
        let slot = std::mem::size_of::<Held>() + 1;
        self.records
            .each()
            .fold(MemoryUsage::default(), |usage, shard| MemoryUsage {
                records: usage.records + shard.len(),
                bytes: usage.bytes
                    + shard.capacity() * slot
                    + shard.iter().map(Held::heap_bytes).sum::<usize>(),
            })
    }

    /// The size of a table slot: a record and its control byte.
    #[cfg(test)]
    pub(super) fn slot_bytes() -> usize {
        std::mem::size_of::<Held>() + 1
    }
}

#[async_trait]
impl RecordStore for MemoryRecords {
    async fn insert(&self, claim: &ClaimRequest<'_>) -> Result<Inserted, StoreError> {
        let now = self.now();
        let id = self.records.id(claim.scope, claim.key);
        let mut shard = self.records.lock(id);
        match shard.entry(id) {
            Entry::Vacant(vacant) => {
                vacant.insert(Held::inserted(Id::new(id), claim, now));
                Ok(Inserted::Inserted)
            }
            Entry::Occupied(occupied) => Ok(Inserted::Exists(occupied.get().record()?, now)),
        }
    }

    async fn read(&self, scope: &str, key: &str) -> Result<(Option<Record>, StoreNow), StoreError> {
        let now = self.now();
        let id = self.records.id(scope, key);
        let shard = self.records.lock(id);
        Ok((shard.get(id).map(Held::record).transpose()?, now))
    }

    async fn update(
        &self,
        scope: &str,
        key: &str,
        version: u64,
        change: &Change<'_>,
    ) -> Result<Updated, StoreError> {
        let id = self.records.id(scope, key);
        let mut shard = self.records.lock(id);
        match shard.get_mut(id) {
            Some(held) if held.version == version => {
                held.apply(change, || self.now());
                Ok(Updated::Updated(held.version))
            }
            current => Ok(Updated::Stale(
                current.map(|held| held.record()).transpose()?,
                self.now(),
            )),
        }
    }

    async fn delete(&self, scope: &str, key: &str, version: u64) -> Result<bool, StoreError> {
        let id = self.records.id(scope, key);
        let mut shard = self.records.lock(id);
        Ok(shard
            .remove_if(id, |held| held.version == version)
            .is_some())
    }

    async fn delete_many(&self, records: &[(&str, &str, u64)]) -> Result<u64, StoreError> {
        let mut deleted = 0;
        for &(scope, key, version) in records {
            let id = self.records.id(scope, key);
            let mut shard = self.records.lock(id);
            if shard
                .remove_if(id, |held| held.version == version)
                .is_some()
            {
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    async fn past_expiry(&self, limit: u32) -> Result<(Vec<KeyedRecord>, StoreNow), StoreError> {
        let now = self.now();
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let mut past = Vec::new();
        for shard in self.records.each() {
            let expired = shard
                .iter()
                .filter(|held| held.expires_at <= now.wall_millis)
                .take(limit - past.len());
            for held in expired {
                let (scope, key) = held.id.scope_and_key();
                past.push(KeyedRecord {
                    scope: scope.to_owned(),
                    key: key.to_owned(),
                    record: held.record()?,
                });
            }
            if past.len() == limit {
                break;
            }
        }
        Ok((past, now))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
            .with_clock(self.clock.clone())
            .in_process()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::ManualClock;
    use crate::store::StoredResponse;

    /// Every change applied in place is what [`Record::changed`] makes of the record, from
    /// an in-progress record with steps and from a completed one.
    #[test]
    fn applies_each_change_as_the_seam_defines_it() {
        let records = MemoryRecords::new(Arc::new(ManualClock::at_millis(1_700_000_000_000)));
        let now = StoreNow {
            wall_millis: 1_700_000_100_000,
            lease_millis: 55_000,
        };
        let fingerprint = Fingerprint {
            version: 2,
            digest: [7; 32],
        };
        let response = StoredResponse {
            status: 201,
            headers: vec![("location".to_owned(), b"/p/1".to_vec())],
            body: Some(Bytes::from_static(b"{}")),
        };
        let claim = |token, ttl| ClaimRequest {
            scope: "s",
            key: "k",
            fingerprint: &fingerprint,
            token: FencingToken(token),
            ttl: Duration::from_secs(ttl),
            lease: Duration::from_secs(10),
        };
        let (first, retry) = (claim(42, 30), claim(43, 60));
        let take_over = |keep_steps| Change::TakeOver {
            claim: &retry,
            keep_steps,
        };
        let changes = [
            take_over(true),
            take_over(false),
            Change::Renew {
                lease: Duration::from_secs(5),
                ttl: Duration::from_secs(500),
            },
            Change::Renew {
                lease: Duration::from_secs(5),
                ttl: Duration::from_secs(1),
            },
            Change::AppendStep(b"step"),
            Change::Complete(&response),
            Change::EndLease,
        ];
        let started = StoreNow {
            wall_millis: 1_700_000_000_000,
            lease_millis: 50_000,
        };
        let id = || Id::new(records.records.id("s", "k"));
        let mut in_progress = Held::inserted(id(), &first, started);
        in_progress.apply(&Change::AppendStep(b"one"), || started);
        let mut completed = Held::inserted(id(), &first, started);
        completed.apply(&Change::Complete(&response), || started);
        for held in [in_progress, completed] {
            let before = held.record().unwrap();
            assert_eq!(before, {
                let first = Record::claimed(&first, started);
                match &held.body {
                    HeldBody::InProgress { .. } => {
                        first.changed(&Change::AppendStep(b"one"), started)
                    }
                    HeldBody::Completed(_) => first.changed(&Change::Complete(&response), started),
                }
            });
            for change in &changes {
                let mut changed = Held {
                    id: id(),
                    body: match &held.body {
                        HeldBody::InProgress {
                            lease_expires_at,
                            steps,
                        } => HeldBody::InProgress {
                            lease_expires_at: *lease_expires_at,
                            steps: steps.clone(),
                        },
                        HeldBody::Completed(response) => HeldBody::Completed(response.clone()),
                    },
                    ..held
                };
                changed.apply(change, || now);
                assert_eq!(
                    changed.record().unwrap(),
                    before.changed(change, now),
                    "{change:?} of {before:?}"
                );
            }
        }
    }
}
