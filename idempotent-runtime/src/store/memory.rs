//! [`MemoryStore`]: records in a sharded, mutex-guarded map.
//!
//! **Single process only.** Two instances of an app each have their own map, so a retry
//! landing on the other instance runs the handler again, and a restart forgets every
//! key. Use it for tests and single-process demos; use `SqliteStore` on one host and
//! `PostgresStore` across hosts.
//!
//! Every request touches the map, so it is laid out for a cheap claim: `(scope, key)` is
//! hashed once, that hash picks one of [`SHARDS`] maps and is reused as the map's own
//! hash; a lookup borrows the caller's strings (only a new record allocates its id, once);
//! and a map that grows rehashes only its shard's records, not the whole store at once.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use super::operator::{lease_left_from_millis, system_time_from_millis};
use super::record::CompactResponse;
use super::takeover::{Found, takeover};
use super::{
    ClaimOutcome, ClaimRequest, FencingToken, ForgetOutcome, RecordInfo, RecordState, Store,
    StoreError, StoredResponse, retry_after_from_millis,
};
use crate::clock::{Clock, SystemClock, millis};
use crate::fingerprint::Fingerprint;
use crate::prehashed::PassThrough;

/// How many independently locked maps hold the records: a map's growth rehashes 1/SHARDS
/// of them, and concurrent requests on different keys rarely wait for each other.
const SHARDS: usize = 32;

/// An in-memory [`Store`] for tests and single-process demos (see the module docs).
#[derive(Debug, Clone)]
pub struct MemoryStore {
    shards: Arc<Shards>,
    clock: Arc<dyn Clock>,
}

/// The maps, and the keyed hash every record id is hashed with once.
#[derive(Debug)]
struct Shards {
    hasher: RandomState,
    maps: Box<[Mutex<Shard>]>,
}

/// One shard: its map hashes an id by the hash it carries (see [`PassThrough`]).
type Shard = HashMap<RecordId, Record, BuildHasherDefault<PassThrough>>;

/// A record's `(scope, key)` in one allocation, with its hash.
#[derive(Debug, PartialEq, Eq)]
struct RecordId {
    hash: u64,
    /// The scope followed by the key; `scope_len` bytes of scope.
    text: Box<str>,
    scope_len: usize,
}

/// What a map needs to find a record: the id's hash and its two parts. Implemented by the
/// stored [`RecordId`] and by the borrowed [`Lookup`], so a lookup allocates nothing.
trait IdParts {
    fn id_hash(&self) -> u64;
    fn scope(&self) -> &str;
    fn key(&self) -> &str;
}

impl IdParts for RecordId {
    fn id_hash(&self) -> u64 {
        self.hash
    }
    fn scope(&self) -> &str {
        &self.text[..self.scope_len]
    }
    fn key(&self) -> &str {
        &self.text[self.scope_len..]
    }
}

/// A `(scope, key)` borrowed from the caller, hashed.
struct Lookup<'a> {
    hash: u64,
    scope: &'a str,
    key: &'a str,
}

impl IdParts for Lookup<'_> {
    fn id_hash(&self) -> u64 {
        self.hash
    }
    fn scope(&self) -> &str {
        self.scope
    }
    fn key(&self) -> &str {
        self.key
    }
}

impl Lookup<'_> {
    fn to_id(&self) -> RecordId {
        let mut text = String::with_capacity(self.scope.len() + self.key.len());
        text.push_str(self.scope);
        text.push_str(self.key);
        RecordId {
            hash: self.hash,
            text: text.into_boxed_str(),
            scope_len: self.scope.len(),
        }
    }
}

// `RecordId` and `dyn IdParts` hash and compare alike (the carried hash; scope and key),
// as `Borrow` requires.
impl Hash for RecordId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl Hash for dyn IdParts + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.id_hash());
    }
}

impl PartialEq for dyn IdParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.id_hash() == other.id_hash()
            && self.scope() == other.scope()
            && self.key() == other.key()
    }
}

impl Eq for dyn IdParts + '_ {}

impl<'a> Borrow<dyn IdParts + 'a> for RecordId {
    fn borrow(&self) -> &(dyn IdParts + 'a) {
        self
    }
}

impl Shards {
    fn new() -> Self {
        Self {
            hasher: RandomState::new(),
            maps: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    fn lookup<'a>(&self, scope: &'a str, key: &'a str) -> Lookup<'a> {
        // Framed like a `(String, String)`: each part's length goes in, so ("ab", "c")
        // and ("a", "bc") hash apart.
        let hash = self.hasher.hash_one((scope, key));
        Lookup { hash, scope, key }
    }

    /// The shard of `hash`. Its bits 32.. pick it: the map uses the low bits for the
    /// bucket and the top seven for its control bytes, which must stay spread within
    /// a shard.
    fn lock(&self, hash: u64) -> MutexGuard<'_, Shard> {
        let index = (hash >> 32) as usize % SHARDS;
        lock(&self.maps[index])
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic while holding the lock cannot leave a record half-written: every
    // mutation below is a single insert, remove or field assignment.
    shard.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug, Clone)]
struct Record {
    fingerprint: Fingerprint,
    token: FencingToken,
    /// When the claim that wrote it was made; only operators read it.
    created_at: i64,
    expires_at: i64,
    state: State,
}

impl Record {
    /// Not expired: within its TTL, or a claim whose lease is still live.
    fn is_live(&self, now: i64) -> bool {
        self.expires_at > now
            || matches!(self.state, State::InProgress { lease_expires_at } if lease_expires_at > now)
    }

    /// What an operator sees of it at `now`.
    fn info(&self, now: i64) -> RecordInfo {
        let state = match &self.state {
            State::InProgress { lease_expires_at } => RecordState::InProgress {
                lease_expires_at: system_time_from_millis(*lease_expires_at),
                holder_alive: *lease_expires_at > now,
            },
            State::Completed(response) => RecordState::Completed {
                status: response.status,
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

#[derive(Debug, Clone)]
enum State {
    InProgress {
        lease_expires_at: i64,
    },
    /// Kept compact: a record outlives the requests around it (see [`CompactResponse`]).
    Completed(CompactResponse),
}

impl MemoryStore {
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
        self.shards.maps.iter().map(|shard| lock(shard).len()).sum()
    }

    /// Whether the store holds no records.
    pub fn is_empty(&self) -> bool {
        self.shards.maps.iter().all(|shard| lock(shard).is_empty())
    }

    /// Runs `f` on the record of `(scope, key)` when `token` holds it in progress;
    /// `otherwise` when not.
    fn with_owned_record<R>(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        f: impl FnOnce(&mut Shard, &dyn IdParts, i64) -> R,
        otherwise: R,
    ) -> R {
        let now = self.clock.now_millis();
        let id = self.shards.lookup(scope, key);
        let mut records = self.shards.lock(id.hash);
        match records.get(&id as &dyn IdParts) {
            Some(r) if r.token == token && matches!(r.state, State::InProgress { .. }) => {
                f(&mut records, &id, now)
            }
            _ => otherwise,
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn try_claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        Ok(self.claim_with_expiry(claim).await?.0)
    }

    async fn claim_with_expiry(
        &self,
        claim: &ClaimRequest<'_>,
    ) -> Result<(ClaimOutcome, Option<Duration>), StoreError> {
        let now = self.clock.now_millis();
        let id = self.shards.lookup(claim.scope, claim.key);
        let mut records = self.shards.lock(id.hash);
        let existing = records.get_mut(&id as &dyn IdParts);
        let takeover = match &existing {
            None => None,
            Some(existing) => {
                let same_fingerprint = existing.fingerprint == *claim.fingerprint;
                let found = Found {
                    completed: matches!(existing.state, State::Completed(_)),
                    ttl_ran_out: existing.expires_at <= now,
                    lease_ran_out: matches!(
                        existing.state,
                        State::InProgress { lease_expires_at } if lease_expires_at <= now
                    ),
                    same_fingerprint,
                };
                match takeover(found) {
                    Some(reason) => Some(reason),
                    None if !same_fingerprint => return Ok((ClaimOutcome::Mismatch, None)),
                    None => {
                        return Ok(match &existing.state {
                            State::Completed(response) => (
                                ClaimOutcome::Replay(response.to_stored()?),
                                Some(remaining(existing.expires_at - now)),
                            ),
                            State::InProgress { lease_expires_at } => (
                                ClaimOutcome::InProgress {
                                    retry_after: retry_after_from_millis(lease_expires_at - now),
                                },
                                None,
                            ),
                        });
                    }
                }
            }
        };
        let record = Record {
            fingerprint: *claim.fingerprint,
            token: claim.token,
            created_at: now,
            expires_at: now.saturating_add(millis(claim.ttl)),
            state: State::InProgress {
                lease_expires_at: now.saturating_add(millis(claim.lease)),
            },
        };
        // A takeover replaces the record in place: its id is allocated once, when new.
        match existing {
            Some(existing) => *existing = record,
            None => {
                records.insert(id.to_id(), record);
            }
        }
        Ok((
            ClaimOutcome::Claimed {
                token: claim.token,
                takeover,
            },
            None,
        ))
    }

    async fn renew(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        Ok(self.with_owned_record(
            scope,
            key,
            token,
            |records, id, now| {
                if let Some(record) = records.get_mut(id) {
                    let lease_expires_at = now.saturating_add(millis(lease));
                    record.state = State::InProgress { lease_expires_at };
                    record.expires_at = record.expires_at.max(lease_expires_at);
                }
                true
            },
            false,
        ))
    }

    async fn complete(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        Ok(self.with_owned_record(
            scope,
            key,
            token,
            |records, id, _| {
                if let Some(record) = records.get_mut(id) {
                    record.state = State::Completed(CompactResponse::new(response));
                }
                true
            },
            false,
        ))
    }

    async fn release(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        Ok(self.with_owned_record(
            scope,
            key,
            token,
            |records, id, _| records.remove(id).is_some(),
            false,
        ))
    }

    async fn purge_expired(&self, limit: u32) -> Result<u64, StoreError> {
        let now = self.clock.now_millis();
        let mut left = limit as usize;
        for shard in &self.shards.maps {
            if left == 0 {
                break;
            }
            let mut records = lock(shard);
            records.retain(|_, r| {
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
        let now = self.clock.now_millis();
        let id = self.shards.lookup(scope, key);
        let records = self.shards.lock(id.hash);
        Ok(records
            .get(&id as &dyn IdParts)
            .filter(|r| r.is_live(now))
            .map(|r| r.info(now)))
    }

    async fn forget(
        &self,
        scope: &str,
        key: &str,
        force: bool,
    ) -> Result<ForgetOutcome, StoreError> {
        let now = self.clock.now_millis();
        let id = self.shards.lookup(scope, key);
        let mut records = self.shards.lock(id.hash);
        let Some(record) = records.get(&id as &dyn IdParts) else {
            return Ok(ForgetOutcome::NotFound);
        };
        if !record.is_live(now) {
            records.remove(&id as &dyn IdParts);
            return Ok(ForgetOutcome::NotFound);
        }
        if let State::InProgress { lease_expires_at } = record.state
            && lease_expires_at > now
            && !force
        {
            return Ok(ForgetOutcome::Refused {
                lease_left: lease_left_from_millis(lease_expires_at - now),
            });
        }
        let info = record.info(now);
        records.remove(&id as &dyn IdParts);
        Ok(ForgetOutcome::Forgotten(info))
    }

    fn clock(&self) -> Option<Arc<dyn Clock>> {
        Some(self.clock.clone())
    }
    fn in_process(&self) -> bool {
        true
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
            let outcome = store.try_claim(&claim(scope, key, &fingerprint)).await;
            assert!(
                matches!(outcome, Ok(ClaimOutcome::Claimed { takeover: None, .. })),
                "{scope:?} {key:?}: {outcome:?}"
            );
        }
        assert_eq!(store.len(), 4);
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
            store.try_claim(&request).await.unwrap();
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
}
