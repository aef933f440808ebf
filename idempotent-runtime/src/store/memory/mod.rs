//! [`MemoryStore`]: records in a sharded, mutex-guarded map.
//!
//! **Single process only.** Two instances of an app each have their own map, so a retry
//! landing on the other instance runs the handler again, and a restart forgets every
//! key. Use it for tests and single-process demos; use `SqliteStore` on one host and
//! `PostgresStore` across hosts.
//!
//! Every request touches the map, so it is laid out for a cheap claim: `(scope, key)` is
//! hashed once, that hash picks one of [`SHARDS`] tables and is the table's own hash; a
//! lookup compares the caller's strings with the record's in place (nothing allocated);
//! and a table that grows rehashes only its shard's records, by the hashes they carry,
//! not the whole store at once.
//!
//! A record outlives the requests around it, so it allocates nothing of its own: its id
//! and, once completed, its response's headers and body are one entry in its shard's
//! [`Arena`], and the rest is a row of the table.

use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use super::operator::{lease_left_from_millis, system_time_from_millis};
use super::record::{decode_headers, encode_headers_into, encoded_headers_len};
use super::takeover::{Decision, Found, decide};
use super::{
    Capabilities, ClaimAnswer, ClaimOutcome, ClaimRequest, FencingToken, ForgetOutcome, RecordInfo,
    RecordState, Store, StoreError, StoredResponse, retry_after_from_millis,
};
use crate::clock::{Clock, SystemClock, millis};
use crate::fingerprint::Fingerprint;

mod arena;

use arena::{Arena, Span};

/// How many independently locked tables hold the records: a table's growth rehashes
/// 1/SHARDS of them, and concurrent requests on different keys rarely wait for each other.
const SHARDS: usize = 32;

/// An in-memory [`Store`] for tests and single-process demos (see the module docs).
#[derive(Debug, Clone)]
pub struct MemoryStore {
    shards: Arc<Shards>,
    clock: Arc<dyn Clock>,
}

/// The shards, and the keyed hash every record id is hashed with once.
#[derive(Debug)]
struct Shards {
    hasher: RandomState,
    shards: Box<[Mutex<Shard>]>,
}

impl Shards {
    fn new() -> Self {
        Self {
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    fn hash(&self, scope: &str, key: &str) -> u64 {
        // Framed like a `(String, String)`: each part's length goes in, so ("ab", "c")
        // and ("a", "bc") hash apart.
        self.hasher.hash_one((scope, key))
    }

    /// The shard of `hash`. Its bits 32.. pick it: the table uses the low bits for the
    /// bucket and the top seven for its control bytes, which must stay spread within
    /// a shard.
    fn lock(&self, hash: u64) -> MutexGuard<'_, Shard> {
        let index = (hash >> 32) as usize % SHARDS;
        lock(&self.shards[index])
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic while holding the lock cannot leave a record half-written: the table and
    // the arena change only in code that does not panic (short of an allocation failure).
    shard.lock().unwrap_or_else(|e| e.into_inner())
}

/// One shard: its records, found by the hash each carries, and the bytes they keep.
#[derive(Debug, Default)]
struct Shard {
    records: HashTable<Record>,
    arena: Arena,
}

impl Shard {
    /// The record of `(scope, key)`.
    fn find(&self, hash: u64, scope: &str, key: &str) -> Option<&Record> {
        let arena = &self.arena;
        self.records.find(hash, |r| r.is(arena, scope, key))
    }

    /// The record of `(scope, key)` when `token` holds it in progress.
    fn owned(
        &mut self,
        hash: u64,
        scope: &str,
        key: &str,
        token: FencingToken,
    ) -> Option<&mut Record> {
        owned(&mut self.records, &self.arena, hash, (scope, key), token)
    }

    /// Records `response` as the outcome of the claim `token` holds on `(scope, key)`;
    /// `false` when it holds none.
    fn complete(
        &mut self,
        hash: u64,
        (scope, key): (&str, &str),
        token: FencingToken,
        response: &StoredResponse,
    ) -> bool {
        let Some(record) = owned(&mut self.records, &self.arena, hash, (scope, key), token) else {
            return false;
        };
        let headers_len = encoded_headers_len(&response.headers);
        let body = response.body.as_deref().unwrap_or_default();
        let len = record.id_len + headers_len + body.len();
        let prefix = (record.span, record.id_len);
        let (span, sealed) = self.arena.push_with(hash, Some(prefix), len, |bytes| {
            encode_headers_into(bytes, &response.headers);
            bytes.extend_from_slice(body);
        });
        let old = std::mem::replace(&mut record.span, span);
        record.state = State::Completed(Kept {
            status: response.status,
            headers_len,
            has_body: response.body.is_some(),
        });
        let freed = self.arena.free(old);
        self.evacuate([sealed, freed]);
        true
    }

    /// Removes the record of `(scope, key)`, with its bytes, if `removable` says so;
    /// whether it did.
    fn remove(
        &mut self,
        hash: u64,
        (scope, key): (&str, &str),
        removable: impl FnOnce(&Record) -> bool,
    ) -> bool {
        let arena = &self.arena;
        let Ok(entry) = self.records.find_entry(hash, |r| r.is(arena, scope, key)) else {
            return false;
        };
        if !removable(entry.get()) {
            return false;
        }
        let (record, _) = entry.remove();
        let sparse = self.arena.free(record.span);
        self.evacuate([sparse, None]);
        true
    }

    /// Moves the live entries of each sparse block (and of any block that sealing makes
    /// sparse meanwhile) to the arena's current block, and frees it.
    fn evacuate(&mut self, sparse: [Option<u32>; 2]) {
        if sparse == [None, None] {
            return;
        }
        let mut pending: Vec<u32> = sparse.into_iter().flatten().collect();
        while let Some(index) = pending.pop() {
            let Some(block) = self.arena.take_sparse(index) else {
                continue;
            };
            for (hash, from, bytes) in block.entries() {
                // A freed entry has no record pointing at it any more.
                if let Some(record) = self.records.find_mut(hash, |r| r.span == from) {
                    let (to, sealed) = self.arena.push(hash, &[bytes]);
                    record.span = to;
                    pending.extend(sealed);
                }
            }
            self.arena.evacuated(block);
        }
    }
}

/// The record of `(scope, key)` in `records` when `token` holds it in progress (a
/// function of the shard's parts, so that a caller may push to the arena meanwhile).
fn owned<'r>(
    records: &'r mut HashTable<Record>,
    arena: &Arena,
    hash: u64,
    (scope, key): (&str, &str),
    token: FencingToken,
) -> Option<&'r mut Record> {
    records
        .find_mut(hash, |r| r.is(arena, scope, key))
        .filter(|r| r.is_held_by(token))
}

/// One record: a row of its shard's table, its bytes in the shard's arena.
#[derive(Debug)]
struct Record {
    /// The hash of `(scope, key)`, with the store's keyed hasher.
    hash: u64,
    /// Its entry in the arena: the scope, then the key (`id_len` bytes in all,
    /// `scope_len` of scope); then, when completed, the response (see [`Kept`]).
    span: Span,
    scope_len: usize,
    id_len: usize,
    fingerprint: Fingerprint,
    token: FencingToken,
    /// When the claim that wrote it was made; only operators read it.
    created_at: i64,
    expires_at: i64,
    state: State,
}

#[derive(Debug, Clone, Copy)]
enum State {
    InProgress { lease_expires_at: i64 },
    Completed(Kept),
}

/// Where a completed record keeps its response: in its entry, after the id, its headers
/// (`headers_len` bytes, [`encode_headers_into`]), then its body when it was kept.
#[derive(Debug, Clone, Copy)]
struct Kept {
    status: u16,
    headers_len: usize,
    has_body: bool,
}

impl Record {
    /// A new claim of `(scope, key)`, its id pushed to `arena`; and a block its push made
    /// sparse.
    fn claimed(
        arena: &mut Arena,
        hash: u64,
        scope: &str,
        key: &str,
        claim: Claimed,
    ) -> (Self, Option<u32>) {
        let (span, sealed) = arena.push(hash, &[scope.as_bytes(), key.as_bytes()]);
        let mut record = Self {
            hash,
            span,
            scope_len: scope.len(),
            id_len: scope.len() + key.len(),
            fingerprint: claim.fingerprint,
            token: claim.token,
            created_at: 0,
            expires_at: 0,
            state: State::InProgress {
                lease_expires_at: 0,
            },
        };
        record.claim(claim);
        (record, sealed)
    }

    /// Whether this is the record of `(scope, key)`. Scope and key are compared apart:
    /// ("ab", "c") is not ("a", "bc").
    fn is(&self, arena: &Arena, scope: &str, key: &str) -> bool {
        if self.scope_len != scope.len() || self.id_len != scope.len() + key.len() {
            return false;
        }
        let (stored_scope, rest) = arena.get(self.span).split_at(self.scope_len);
        stored_scope == scope.as_bytes() && rest[..key.len()] == *key.as_bytes()
    }

    /// Claimed anew (a takeover): the id stays; a response it held is no longer read,
    /// and its bytes go when the claim completes or the record is removed.
    fn claim(&mut self, claim: Claimed) {
        self.fingerprint = claim.fingerprint;
        self.token = claim.token;
        self.created_at = claim.now.wall;
        self.expires_at = claim.now.wall.saturating_add(millis(claim.ttl));
        self.state = State::InProgress {
            lease_expires_at: claim.now.monotonic.saturating_add(millis(claim.lease)),
        };
    }

    /// The response it keeps as `kept`, for a replay.
    fn response(&self, arena: &Arena, kept: Kept) -> Result<StoredResponse, StoreError> {
        let (headers, body) = arena.get(self.span)[self.id_len..].split_at(kept.headers_len);
        Ok(StoredResponse {
            status: kept.status,
            headers: decode_headers(headers)?,
            body: kept.has_body.then(|| Bytes::copy_from_slice(body)),
        })
    }

    /// In progress under `token`'s claim.
    fn is_held_by(&self, token: FencingToken) -> bool {
        self.token == token && matches!(self.state, State::InProgress { .. })
    }

    /// Not expired: within its TTL, or a claim whose lease is still live.
    fn is_live(&self, now: Now) -> bool {
        self.expires_at > now.wall
            || matches!(self.state, State::InProgress { lease_expires_at } if lease_expires_at > now.monotonic)
    }

    /// What an operator sees of it at `now` (a lease's end shown in wall-clock time).
    fn info(&self, now: Now) -> RecordInfo {
        let state = match self.state {
            State::InProgress { lease_expires_at } => RecordState::InProgress {
                lease_expires_at: system_time_from_millis(
                    now.wall.saturating_add(lease_expires_at - now.monotonic),
                ),
                holder_alive: lease_expires_at > now.monotonic,
            },
            State::Completed(kept) => RecordState::Completed {
                status: kept.status,
            },
        };
        RecordInfo::new(
            state,
            self.fingerprint,
            system_time_from_millis(self.created_at),
            system_time_from_millis(self.expires_at),
        )
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
            shards: Arc::new(Shards::new()),
            clock,
        }
    }

    /// How many records the store holds (expired ones included until purged).
    pub fn len(&self) -> usize {
        self.shards
            .shards
            .iter()
            .map(|shard| lock(shard).records.len())
            .sum()
    }

    /// Whether the store holds no records.
    pub fn is_empty(&self) -> bool {
        self.shards
            .shards
            .iter()
            .all(|shard| lock(shard).records.is_empty())
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
        let (scope, key) = (claim.scope, claim.key);
        let hash = self.shards.hash(scope, key);
        let claimed = Claimed {
            fingerprint: *claim.fingerprint,
            token: claim.token,
            now,
            ttl: claim.ttl,
            lease: claim.lease,
        };
        let mut shard = self.shards.lock(hash);
        let Shard { records, arena } = &mut *shard;
        let existing = match records.entry(hash, |r| r.is(arena, scope, key), |r| r.hash) {
            Entry::Vacant(vacant) => {
                let (record, sealed) = Record::claimed(arena, hash, scope, key, claimed);
                vacant.insert(record);
                shard.evacuate([sealed, None]);
                let claimed = ClaimOutcome::Claimed {
                    token: claim.token,
                    takeover: None,
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
                State::InProgress { lease_expires_at } if lease_expires_at <= now.monotonic
            ),
            same_fingerprint,
        };
        let (outcome, replay_lives_for) = match decide(found) {
            // A takeover rewrites the record in place: its id was pushed once, when new.
            Decision::Take(reason) => {
                existing.claim(claimed);
                let claimed = ClaimOutcome::Claimed {
                    token: claim.token,
                    takeover: Some(reason),
                };
                (claimed, None)
            }
            Decision::Mismatch => (ClaimOutcome::Mismatch, None),
            // Replay or in progress: which one is the record's state.
            Decision::Replay | Decision::InProgress => match existing.state {
                State::Completed(kept) => (
                    ClaimOutcome::Replay(existing.response(arena, kept)?),
                    Some(remaining(existing.expires_at - now.wall)),
                ),
                State::InProgress { lease_expires_at } => {
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
    ) -> Result<bool, StoreError> {
        let now = self.now();
        let hash = self.shards.hash(scope, key);
        let mut shard = self.shards.lock(hash);
        let Some(record) = shard.owned(hash, scope, key, token) else {
            return Ok(false);
        };
        record.state = State::InProgress {
            lease_expires_at: now.monotonic.saturating_add(millis(lease)),
        };
        record.expires_at = record
            .expires_at
            .max(now.wall.saturating_add(millis(lease)));
        Ok(true)
    }

    async fn complete(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        let hash = self.shards.hash(scope, key);
        let mut shard = self.shards.lock(hash);
        Ok(shard.complete(hash, (scope, key), token, response))
    }

    async fn release(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        let hash = self.shards.hash(scope, key);
        let mut shard = self.shards.lock(hash);
        Ok(shard.remove(hash, (scope, key), |r| r.is_held_by(token)))
    }

    async fn purge_expired(&self, limit: u32) -> Result<u64, StoreError> {
        let now = self.now();
        let mut left = limit as usize;
        for shard in &self.shards.shards {
            if left == 0 {
                break;
            }
            let mut shard = lock(shard);
            let Shard { records, arena } = &mut *shard;
            let mut sparse = Vec::new();
            records.retain(|r| {
                let purge = left > 0 && !r.is_live(now);
                if purge {
                    left -= 1;
                    sparse.extend(arena.free(r.span));
                }
                !purge
            });
            for index in sparse {
                shard.evacuate([Some(index), None]);
            }
        }
        Ok((limit as usize - left) as u64)
    }

    async fn inspect(&self, scope: &str, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        let now = self.now();
        let hash = self.shards.hash(scope, key);
        let shard = self.shards.lock(hash);
        Ok(shard
            .find(hash, scope, key)
            .filter(|r| r.is_live(now))
            .map(|r| r.info(now)))
    }

    async fn forget(
        &self,
        scope: &str,
        key: &str,
        force: bool,
    ) -> Result<ForgetOutcome, StoreError> {
        let now = self.now();
        let hash = self.shards.hash(scope, key);
        let mut shard = self.shards.lock(hash);
        let Some(record) = shard.find(hash, scope, key) else {
            return Ok(ForgetOutcome::NotFound);
        };
        let outcome = if !record.is_live(now) {
            ForgetOutcome::NotFound
        } else if let State::InProgress { lease_expires_at } = record.state
            && lease_expires_at > now.monotonic
            && !force
        {
            return Ok(ForgetOutcome::Refused {
                lease_left: lease_left_from_millis(lease_expires_at - now.monotonic),
            });
        } else {
            ForgetOutcome::Forgotten(record.info(now))
        };
        shard.remove(hash, (scope, key), |_| true);
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
    use super::*;
    use crate::clock::ManualClock;

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
                    takeover: Some(crate::Takeover::LeaseLost),
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

    /// Allocated and live bytes over every shard's arena.
    fn arena_bytes(store: &MemoryStore) -> (usize, usize) {
        store
            .shards
            .shards
            .iter()
            .fold((0, 0), |(allocated, live), shard| {
                let shard = lock(shard);
                (
                    allocated + shard.arena.allocated(),
                    live + shard.arena.live(),
                )
            })
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
    async fn records_keep_their_bytes_while_the_arena_moves_them_and_it_stays_within_four_times_live()
     {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(Arc::new(clock.clone()));
        let fingerprint = Fingerprint {
            version: 1,
            digest: [3; 32],
        };
        // Bodies of many sizes, some over the arena's large-entry size; one record in ten
        // outlives the rest, so when the rest expire every block is left sparse.
        // (Enough small ones that what they fill is far more than a block per shard.)
        let len_of = |i: usize| [0, 40, 300, 2_000, 300, 9_000, 40, 70_000][i % 8] + i % 7;
        let keys: Vec<String> = (0..16_000).map(|i| format!("key-{i}")).collect();
        for (i, key) in keys.iter().enumerate() {
            let ttl = if i % 10 == 0 { 3_600 } else { 60 };
            let request = ClaimRequest {
                ttl: Duration::from_secs(ttl),
                ..claim("scope", key, &fingerprint)
            };
            store.claim(&request).await.unwrap();
            let response = stored(key, len_of(i));
            assert!(
                store
                    .complete("scope", key, request.token, &response)
                    .await
                    .unwrap()
            );
        }
        clock.advance(Duration::from_secs(61));
        assert_eq!(store.purge_expired(100_000).await.unwrap(), 14_400);
        let (allocated, live) = arena_bytes(&store);
        assert!(
            allocated <= 4 * live + SHARDS * arena::BLOCK,
            "{allocated} bytes allocated for {live} live"
        );
        // Every survivor replays what it recorded, moved or not; and new records written
        // after the moves are found beside them.
        for (i, key) in keys.iter().enumerate() {
            let outcome = store
                .claim(&claim("scope", key, &fingerprint))
                .await
                .unwrap()
                .outcome;
            if i % 10 == 0 {
                match outcome {
                    ClaimOutcome::Replay(replayed) => assert_eq!(replayed, stored(key, len_of(i))),
                    other => panic!("{key}: {other:?}"),
                }
            } else {
                // Expired and purged: claimed anew; completed again with another body.
                let ClaimOutcome::Claimed { token, .. } = outcome else {
                    panic!("{key}: {outcome:?}");
                };
                let response = stored(key, len_of(i + 1));
                assert!(
                    store
                        .complete("scope", key, token, &response)
                        .await
                        .unwrap()
                );
            }
        }
        for (i, key) in keys.iter().enumerate() {
            let expected = stored(key, len_of(if i % 10 == 0 { i } else { i + 1 }));
            match store
                .claim(&claim("scope", key, &fingerprint))
                .await
                .unwrap()
                .outcome
            {
                ClaimOutcome::Replay(replayed) => assert_eq!(replayed, expected, "{key}"),
                other => panic!("{key}: {other:?}"),
            }
        }
        // Everything gone: nothing live, nothing held but the blocks being filled.
        clock.advance(Duration::from_secs(7_200));
        assert_eq!(store.purge_expired(100_000).await.unwrap(), 16_000);
        let (allocated, live) = arena_bytes(&store);
        assert_eq!(live, 0);
        assert!(
            allocated <= SHARDS * arena::BLOCK,
            "{allocated} bytes held empty"
        );
    }

    #[tokio::test]
    async fn a_takeover_keeps_the_id_and_its_completion_frees_the_old_response() {
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
        let (_, live) = arena_bytes(&store);
        assert_eq!(
            live,
            arena::FRAME + 1 + 1 + encoded_headers_len(&stored("k", 700).headers) + 700
        );
        assert!(matches!(
            store.forget("s", "k", false).await.unwrap(),
            ForgetOutcome::Forgotten(_)
        ));
        assert_eq!(arena_bytes(&store).1, 0);
        assert!(store.is_empty());
    }
}
