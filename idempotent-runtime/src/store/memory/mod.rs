//! [`MemoryStore`]: records in a sharded, mutex-guarded map.
//!
//! **Single process only.** Two instances of an app each have their own map, so a retry
//! landing on the other instance runs the handler again, and a restart forgets every
//! key. Use it for tests and single-process demos; use `SqliteStore` on one host and
//! `PostgresStore` across hosts.
//!
//! The records live in a [`Sharded`] map, so that requests on different keys rarely wait
//! for each other's lock; each record owns its id and, once completed, its response.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hashbrown::hash_table::Entry;

use super::operator::{lease_left_from_millis, system_time_from_millis};
use super::record::CompactResponse;
use super::takeover::{Decision, Found, decide};
use super::{
    Capabilities, ClaimAnswer, ClaimOutcome, ClaimRequest, FencingToken, ForgetOutcome,
    MemoryUsage, RecordInfo, RecordState, RecordedStep, Store, StoreError, StoredResponse,
    decode_steps, encode_step, release_keeps_record, retry_after_from_millis, steps_survive,
};
use crate::clock::{Clock, SystemClock, millis};
use crate::fingerprint::Fingerprint;
use crate::sharded::{Id, Identified, Sharded, Table};

/// How many independently locked tables hold the records.
const SHARDS: usize = 32;

/// An in-memory [`Store`] for tests and single-process demos (see the module docs).
#[derive(Debug, Clone)]
pub struct MemoryStore {
    records: Arc<Sharded<Table<Record>>>,
    clock: Arc<dyn Clock>,
}

/// One record of `(scope, key)`.
#[derive(Debug)]
struct Record {
    id: Id,
    fingerprint: Fingerprint,
    token: FencingToken,
    /// When the claim that wrote it was made; only operators read it.
    created_at: i64,
    expires_at: i64,
    state: State,
}

#[derive(Debug)]
enum State {
    /// Claimed; `steps` are the steps recorded under it, encoded ([`encode_step`]).
    InProgress {
        lease_expires_at: i64,
        steps: Vec<u8>,
    },
    Completed(CompactResponse),
}

impl Identified for Record {
    fn id(&self) -> &Id {
        &self.id
    }
}

impl Record {
    /// A new claim of `id`.
    fn claimed(id: Id, claim: Claimed) -> Self {
        let mut record = Self {
            id,
            fingerprint: claim.fingerprint,
            token: claim.token,
            created_at: 0,
            expires_at: 0,
            state: State::InProgress {
                lease_expires_at: 0,
                steps: Vec::new(),
            },
        };
        record.claim(claim, false);
        record
    }

    /// Claimed anew (a takeover): the id stays, a response it held goes, and its steps
    /// go unless `keep_steps`. Returns the steps kept.
    fn claim(&mut self, claim: Claimed, keep_steps: bool) -> Vec<u8> {
        self.fingerprint = claim.fingerprint;
        self.token = claim.token;
        self.created_at = claim.now.wall;
        self.expires_at = claim.now.wall.saturating_add(millis(claim.ttl));
        let steps = match &mut self.state {
            State::InProgress { steps, .. } if keep_steps => std::mem::take(steps),
            _ => Vec::new(),
        };
        self.state = State::InProgress {
            lease_expires_at: claim.now.monotonic.saturating_add(millis(claim.lease)),
            steps: steps.clone(),
        };
        steps
    }

    /// The bytes it holds outside its table slot: scope and key, stored headers and body.
    fn heap_bytes(&self) -> usize {
        self.id.id_bytes().len()
            + match &self.state {
                State::InProgress { steps, .. } => steps.len(),
                State::Completed(response) => response.heap_bytes(),
            }
    }

    /// In progress under `token`'s claim.
    fn is_held_by(&self, token: FencingToken) -> bool {
        self.token == token && matches!(self.state, State::InProgress { .. })
    }

    /// Not expired: within its TTL, or a claim whose lease is still live.
    fn is_live(&self, now: Now) -> bool {
        self.expires_at > now.wall
            || matches!(self.state, State::InProgress { lease_expires_at, .. } if lease_expires_at > now.monotonic)
    }

    /// What an operator sees of it at `now` (a lease's end shown in wall-clock time).
    fn info(&self, now: Now) -> Result<RecordInfo, StoreError> {
        let (state, steps) = match &self.state {
            State::InProgress {
                lease_expires_at,
                steps,
            } => (
                RecordState::InProgress {
                    lease_expires_at: system_time_from_millis(
                        now.wall.saturating_add(lease_expires_at - now.monotonic),
                    ),
                    holder_alive: *lease_expires_at > now.monotonic,
                },
                decode_steps(steps)?,
            ),
            State::Completed(response) => (
                RecordState::Completed {
                    status: response.status,
                },
                Vec::new(),
            ),
        };
        Ok(RecordInfo::new(
            state,
            self.fingerprint,
            system_time_from_millis(self.created_at),
            system_time_from_millis(self.expires_at),
        )
        .with_steps(steps))
    }
}

/// One instant on both of the store's timelines: wall time for TTLs, monotonic time for
/// leases (a wall-clock step cannot expire a live lease).
#[derive(Debug, Clone, Copy)]
struct Now {
    wall: i64,
    monotonic: i64,
}

/// What a claim writes into a record.
#[derive(Clone, Copy)]
struct Claimed {
    fingerprint: Fingerprint,
    token: FencingToken,
    now: Now,
    ttl: Duration,
    lease: Duration,
}

impl MemoryStore {
    /// Now, on both timelines.
    fn now(&self) -> Now {
        Now {
            wall: self.clock.now_millis(),
            monotonic: self.clock.monotonic_millis(),
        }
    }

    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An empty store on `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            records: Arc::new(Sharded::new(SHARDS, Table::default)),
            clock,
        }
    }

    /// How many records the store holds (expired ones included until purged).
    pub fn len(&self) -> usize {
        self.records.each().map(|shard| shard.len()).sum()
    }

    /// Whether the store holds no records.
    pub fn is_empty(&self) -> bool {
        self.records.each().all(|shard| shard.is_empty())
    }

    /// The records the store holds (expired ones included until purged) and the heap
    /// bytes they take, counted from what they hold: every slot of the maps' tables
    /// (used or not: a table grows by doubling and never shrinks) at the size of a record
    /// plus its control byte, and each record's scope and key, stored headers and
    /// body. Allocator headers and rounding are not counted, and a body is counted at its
    /// length even where its buffer is larger or shared. It walks every record, one shard
    /// locked at a time: an operator's call, not one per request.
    pub fn memory_usage(&self) -> MemoryUsage {
        let slot = std::mem::size_of::<Record>() + 1;
        self.records
            .each()
            .fold(MemoryUsage::default(), |usage, shard| MemoryUsage {
                records: usage.records + shard.len(),
                bytes: usage.bytes
                    + shard.capacity() * slot
                    + shard.iter().map(Record::heap_bytes).sum::<usize>(),
            })
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimAnswer, StoreError> {
        let now = self.now();
        let id = self.records.id(claim.scope, claim.key);
        let claimed = Claimed {
            fingerprint: *claim.fingerprint,
            token: claim.token,
            now,
            ttl: claim.ttl,
            lease: claim.lease,
        };
        let mut shard = self.records.lock(id);
        let existing = match shard.entry(id) {
            Entry::Vacant(vacant) => {
                vacant.insert(Record::claimed(Id::new(id), claimed));
                let claimed = ClaimOutcome::Claimed {
                    token: claim.token,
                    takeover: None,
                    steps: Vec::new(),
                };
                return Ok(claimed.into());
            }
            Entry::Occupied(occupied) => occupied.into_mut(),
        };
        let same_fingerprint = existing.fingerprint == *claim.fingerprint;
        let found = Found {
            completed: matches!(existing.state, State::Completed(_)),
            ttl_ran_out: existing.expires_at <= now.wall,
            lease_ran_out: matches!(
                existing.state,
                State::InProgress { lease_expires_at, .. } if lease_expires_at <= now.monotonic
            ),
            same_fingerprint,
        };
        let (outcome, replay_lives_for) = match decide(found) {
            // A takeover rewrites the record in place, keeping its id.
            Decision::Take(reason) => {
                let steps = existing.claim(claimed, steps_survive(reason));
                let claimed = ClaimOutcome::Claimed {
                    token: claim.token,
                    takeover: Some(reason),
                    steps: decode_steps(&steps)?,
                };
                (claimed, None)
            }
            Decision::Mismatch => (ClaimOutcome::Mismatch, None),
            // Replay or in progress: which one is the record's state.
            Decision::Replay | Decision::InProgress => match &existing.state {
                State::Completed(response) => (
                    ClaimOutcome::Replay(response.to_stored()?),
                    Some(remaining(existing.expires_at - now.wall)),
                ),
                &State::InProgress {
                    lease_expires_at, ..
                } => {
                    let retry_after = retry_after_from_millis(lease_expires_at - now.monotonic);
                    (ClaimOutcome::InProgress { retry_after }, None)
                }
            },
        };
        Ok(ClaimAnswer {
            outcome,
            replay_lives_for,
        })
    }

    async fn renew(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        lease: Duration,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let now = self.now();
        let id = self.records.id(scope, key);
        let mut shard = self.records.lock(id);
        let Some(record) = shard.get_mut(id).filter(|r| r.is_held_by(token)) else {
            return Ok(false);
        };
        if let State::InProgress {
            lease_expires_at, ..
        } = &mut record.state
        {
            *lease_expires_at = now.monotonic.saturating_add(millis(lease));
        }
        record.expires_at = record.expires_at.max(now.wall.saturating_add(millis(ttl)));
        Ok(true)
    }

    async fn complete(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        let id = self.records.id(scope, key);
        let mut shard = self.records.lock(id);
        let Some(record) = shard.get_mut(id).filter(|r| r.is_held_by(token)) else {
            return Ok(false);
        };
        record.state = State::Completed(CompactResponse::new(response));
        Ok(true)
    }

    async fn release(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        let now = self.now();
        let id = self.records.id(scope, key);
        let mut shard = self.records.lock(id);
        let Some(record) = shard.get_mut(id).filter(|r| r.is_held_by(token)) else {
            return Ok(false);
        };
        match &mut record.state {
            State::InProgress {
                lease_expires_at,
                steps,
            } if release_keeps_record(!steps.is_empty()) => {
                *lease_expires_at = now.monotonic;
                record.token = FencingToken::RELEASED;
            }
            _ => {
                shard.remove(id);
            }
        }
        Ok(true)
    }

    async fn record_step(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        step: &RecordedStep,
    ) -> Result<bool, StoreError> {
        let id = self.records.id(scope, key);
        let mut shard = self.records.lock(id);
        let Some(record) = shard.get_mut(id).filter(|r| r.is_held_by(token)) else {
            return Ok(false);
        };
        if let State::InProgress { steps, .. } = &mut record.state {
            steps.extend_from_slice(&encode_step(step));
        }
        Ok(true)
    }

    async fn purge_expired(&self, limit: u32) -> Result<u64, StoreError> {
        let now = self.now();
        let mut left = limit as usize;
        for mut shard in self.records.each() {
            if left == 0 {
                break;
            }
            shard.retain(|r| {
                let purge = left > 0 && !r.is_live(now);
                if purge {
                    left -= 1;
                }
                !purge
            });
        }
        Ok((limit as usize - left) as u64)
    }

    async fn inspect(&self, scope: &str, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        let now = self.now();
        let id = self.records.id(scope, key);
        let shard = self.records.lock(id);
        Ok(shard
            .get(id)
            .filter(|r| r.is_live(now))
            .map(|r| r.info(now))
            .transpose()?)
    }

    async fn forget(
        &self,
        scope: &str,
        key: &str,
        force: bool,
    ) -> Result<ForgetOutcome, StoreError> {
        let now = self.now();
        let id = self.records.id(scope, key);
        let mut shard = self.records.lock(id);
        let Some(record) = shard.get(id) else {
            return Ok(ForgetOutcome::NotFound);
        };
        let outcome = if !record.is_live(now) {
            ForgetOutcome::NotFound
        } else if let State::InProgress {
            lease_expires_at, ..
        } = record.state
            && lease_expires_at > now.monotonic
            && !force
        {
            return Ok(ForgetOutcome::Refused {
                lease_left: lease_left_from_millis(lease_expires_at - now.monotonic),
            });
        } else {
            ForgetOutcome::Forgotten(record.info(now)?)
        };
        shard.remove(id);
        Ok(outcome)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
            .with_clock(self.clock.clone())
            .in_process()
    }
}

/// A record's remaining life from its milliseconds left.
fn remaining(millis: i64) -> Duration {
    Duration::from_millis(u64::try_from(millis).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::clock::ManualClock;
    use crate::store::encode_headers;

    fn claim<'a>(scope: &'a str, key: &'a str, fingerprint: &'a Fingerprint) -> ClaimRequest<'a> {
        ClaimRequest {
            scope,
            key,
            fingerprint,
            ttl: Duration::from_secs(60),
            lease: Duration::from_secs(10),
            token: FencingToken::random(),
        }
    }

    #[tokio::test]
    async fn scope_and_key_are_framed_apart() {
        let store = MemoryStore::new();
        let fingerprint = Fingerprint {
            version: 1,
            digest: [1; 32],
        };
        for (scope, key) in [("ab", "c"), ("a", "bc"), ("", "abc"), ("abc", "")] {
            let outcome = store
                .claim(&claim(scope, key, &fingerprint))
                .await
                .map(|answer| answer.outcome);
            assert!(
                matches!(outcome, Ok(ClaimOutcome::Claimed { takeover: None, .. })),
                "{scope:?} {key:?}: {outcome:?}"
            );
        }
        assert_eq!(store.len(), 4);
    }

    /// Interleaving 3 of the protocol review: a wall-clock step larger than the lease
    /// left must not hand a live claim to a retry; a backward step must not keep a dead
    /// owner's lease alive. TTLs stay on wall time.
    #[tokio::test]
    async fn wall_clock_steps_move_ttls_not_leases() {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(Arc::new(clock.clone()));
        let fingerprint = Fingerprint {
            version: 1,
            digest: [3; 32],
        };
        let first = claim("s", "k", &fingerprint);
        store.claim(&first).await.unwrap();
        // Forward by far more than the 10 s lease (within the 60 s TTL): still held.
        clock.step_wall(30_000);
        let retry = store
            .claim(&claim("s", "k", &fingerprint))
            .await
            .unwrap()
            .outcome;
        assert!(
            matches!(retry, ClaimOutcome::InProgress { .. }),
            "a forward step took a live lease over: {retry:?}"
        );
        let info = store.inspect("s", "k").await.unwrap().expect("live");
        assert!(matches!(
            info.state,
            RecordState::InProgress {
                holder_alive: true,
                ..
            }
        ));
        // Past the TTL by the wall clock, but the lease is live: a running claim keeps it.
        clock.step_wall(60_000);
        let retry = store
            .claim(&claim("s", "k", &fingerprint))
            .await
            .unwrap()
            .outcome;
        assert!(
            matches!(retry, ClaimOutcome::InProgress { .. }),
            "{retry:?}"
        );
        // Backwards by an hour, then the lease's time passes: the crashed owner's lease
        // is over, and the record (now within its TTL by the wall clock) is taken over.
        clock.step_wall(-3_600_000);
        clock.advance(Duration::from_secs(11));
        let retry = store
            .claim(&claim("s", "k", &fingerprint))
            .await
            .unwrap()
            .outcome;
        assert!(
            matches!(
                retry,
                ClaimOutcome::Claimed {
                    takeover: Some(crate::store::Takeover::LeaseLost),
                    ..
                }
            ),
            "{retry:?}"
        );
    }

    #[tokio::test]
    async fn purge_honours_its_limit_across_shards() {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(Arc::new(clock.clone()));
        let fingerprint = Fingerprint {
            version: 1,
            digest: [2; 32],
        };
        for i in 0..200 {
            let key = format!("k{i}");
            let token = FencingToken::random();
            let request = ClaimRequest {
                token,
                ..claim("s", &key, &fingerprint)
            };
            store.claim(&request).await.unwrap();
            let response = StoredResponse {
                status: 200,
                headers: Vec::new(),
                body: None,
            };
            assert!(store.complete("s", &key, token, &response).await.unwrap());
        }
        clock.advance(Duration::from_secs(61));
        assert_eq!(store.purge_expired(150).await.unwrap(), 150);
        assert_eq!(store.len(), 50);
        assert_eq!(store.purge_expired(150).await.unwrap(), 50);
        assert!(store.is_empty());
    }

    /// A body of `len` bytes that says which key it belongs to.
    fn body_of(key: &str, len: usize) -> Bytes {
        let mut body = key.as_bytes().repeat(len / key.len() + 1);
        body.truncate(len);
        Bytes::from(body)
    }

    fn stored(key: &str, len: usize) -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: vec![("location".to_owned(), key.as_bytes().to_vec())],
            body: Some(body_of(key, len)),
        }
    }

    #[tokio::test]
    async fn a_takeover_replaces_the_response_and_forget_removes_the_record() {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(Arc::new(clock.clone()));
        let fingerprint = Fingerprint {
            version: 1,
            digest: [4; 32],
        };
        let first = claim("s", "k", &fingerprint);
        store.claim(&first).await.unwrap();
        assert!(
            store
                .complete("s", "k", first.token, &stored("k", 500))
                .await
                .unwrap()
        );
        // Past its TTL the record is taken over in place, then completed with another body.
        clock.advance(Duration::from_secs(61));
        let second = claim("s", "k", &fingerprint);
        let outcome = store.claim(&second).await.unwrap().outcome;
        assert!(
            matches!(
                outcome,
                ClaimOutcome::Claimed {
                    takeover: Some(_),
                    ..
                }
            ),
            "{outcome:?}"
        );
        assert!(
            !store
                .complete("s", "k", first.token, &stored("k", 9))
                .await
                .unwrap()
        );
        assert!(
            store
                .complete("s", "k", second.token, &stored("k", 700))
                .await
                .unwrap()
        );
        match store
            .claim(&claim("s", "k", &fingerprint))
            .await
            .unwrap()
            .outcome
        {
            ClaimOutcome::Replay(replayed) => assert_eq!(replayed, stored("k", 700)),
            other => panic!("{other:?}"),
        }
        assert_eq!(store.len(), 1);
        assert!(matches!(
            store.forget("s", "k", false).await.unwrap(),
            ForgetOutcome::Forgotten(_)
        ));
        assert!(store.is_empty());
    }

    #[tokio::test]
    async fn memory_usage_counts_each_record_and_every_table_slot() {
        let store = MemoryStore::new();
        assert_eq!(store.memory_usage(), MemoryUsage::default());
        let fingerprint = Fingerprint {
            version: 1,
            digest: [5; 32],
        };
        let keys: Vec<String> = (0..2000).map(|n| format!("key-{n:06}")).collect();
        for key in &keys {
            let request = claim("scope", key, &fingerprint);
            store.claim(&request).await.unwrap();
            assert!(
                store
                    .complete("scope", key, request.token, &stored(key, 300))
                    .await
                    .unwrap()
            );
        }
        let usage = store.memory_usage();
        assert_eq!(usage.records, 2000);
        // Each record's scope and key, encoded headers and body, and at least its own
        // table slot.
        let heap: usize = keys
            .iter()
            .map(|key| {
                "scope".len() + key.len() + encode_headers(&stored(key, 300).headers).len() + 300
            })
            .sum();
        let slot = std::mem::size_of::<Record>() + 1;
        assert!(usage.bytes >= heap + 2000 * slot, "{usage:?}");
        // Tables at most double what they hold, plus a slack of small tables per shard.
        assert!(
            usage.bytes <= heap + 2 * 2000 * slot + SHARDS * 16 * slot,
            "{usage:?}"
        );
        assert!(usage.bytes_per_record().unwrap() >= heap / 2000 + slot);
    }
}
