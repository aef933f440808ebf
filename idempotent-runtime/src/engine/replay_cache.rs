//! The replay cache: completed records this process has seen, kept in memory so that a
//! replay is answered without a store round trip (and without spawning anything).
//!
//! # Why a completed record may be cached
//!
//! A completed record never changes: its fingerprint and response are fixed until it
//! expires (or an operator deletes it). So a copy is exact for as long as the record
//! lives, and the cache only has to make sure it never serves a copy longer than that.
//!
//! # Expiry: never past the record's TTL
//!
//! The store decides expiry on its own clock. Each entry carries a conservative local
//! deadline, read on the *cache's clock* before the store call that proved the record:
//!
//! - **this process's own completion** (only with
//!   [`ReplayCacheConfig::remember_completions`]): the record was claimed with the handler's TTL,
//!   so it lives at least until *(cache time before the claim was sent) + TTL* (a renewal
//!   only ever extends it);
//! - **a replay the store answered:** only when the store says how long the record lives
//!   on ([`ClaimAnswer::replay_lives_for`](crate::store::ClaimAnswer::replay_lives_for)): *(cache
//!   time before the claim was sent) + that remaining life*. A store that cannot tell is
//!   not cached from (its replays still go to the store).
//!
//! The cache's clock is the store's own clock when the store keeps time in this process
//! ([`Capabilities::clock`](crate::store::Capabilities::clock): the memory and SQLite stores, and a
//! test's [`ManualClock`](crate::clock::ManualClock) moves both alike), and otherwise a
//! monotonic clock: a database server's clock runs at the same rate, so a remaining life
//! it measured is at most as long on ours. A server clock that *jumps* forward can make a
//! record expire early; the maximum entry age below bounds how long the cache can then
//! outlive it.
//!
//! # Across instances, and deletion
//!
//! Every instance keeps its own cache; they never disagree about a record's content
//! (it is immutable), only about whether it was deleted. [`Idempotency::forget_cached`]
//! drops one key from this process's cache (the engine's own deletion calls it); other
//! instances may still replay a deleted record for at most the **maximum entry age**
//! ([`ReplayCacheConfig::max_age`], default 10 s) after its deletion, after which every
//! entry goes back to the store. An entry's age counts from before the store call that
//! read or wrote its record was sent, so a slow answer cannot stretch that bound.
//!
//! # Replays answered without hashing
//!
//! An entry is first matched by fingerprint, as the store matches it. The first request it
//! so answers leaves a copy of its framed bytes in the entry ([`RequestFingerprint`]: mode,
//! method, path, query and body, up to [`MAX_REQUEST_COPY`]); a later request with exactly
//! those bytes is the same request, and is answered without computing its SHA-256. A
//! request with other bytes is compared by fingerprint, so a JSON-mode request written
//! differently still replays and another body still gets its `422`.
//!
//! # Memory
//!
//! Bounded in entries and bytes ([`ReplayCacheConfig`]), split over [`SHARDS`] shards of
//! a [`Sharded`] map whose tables grow with use up to their share of the bound, so that a
//! cache far below its bound keeps its entries in a few pages instead of one page each.
//! A shard evicts its oldest entries first (FIFO): a
//! lookup writes nothing but, once per entry, the request copy above (counted against
//! the byte bound, and kept only within the entry's shard's share). Entries larger than a
//! shard's byte share are not cached. Only completed records enter: never an in-progress
//! claim, and never a released one (a 5xx released under `OnServerError::Release` is not
//! a record at all).
//!
//! [`Idempotency::forget_cached`]: super::Idempotency::forget_cached

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use crate::clock::{Clock, millis};
use crate::fingerprint::{Fingerprint, RequestFingerprint};
use crate::key::ScopedKey;
use crate::sharded::{HashedId, Id, Identified, Sharded, Table};
use crate::store::{CompactResponse, MemoryUsage, StoredResponse};

/// How many independently locked shards hold the entries.
const SHARDS: usize = 32;

/// The longest request an entry keeps a copy of, to compare replays with byte for byte
/// instead of by SHA-256 (comparing is cheaper at any length, but the copy is memory).
const MAX_REQUEST_COPY: usize = 16 * 1024;

/// What an entry costs besides its key and response bytes (map slot, queue slot, the
/// cached record and its built response, allocation headers), counted against the byte
/// bound.
const ENTRY_OVERHEAD: usize = 320;

/// The bounds of the engine's replay cache (see
/// [`IdempotencyBuilder::replay_cache`](crate::IdempotencyBuilder::replay_cache)).
///
/// ```
/// use std::time::Duration;
///
/// use idempotent_runtime::Idempotency;
/// use idempotent_runtime::engine::ReplayCacheConfig;
/// use idempotent_runtime::store::MemoryStore;
///
/// let idempotency = Idempotency::builder(MemoryStore::new())
///     .replay_cache(Some(
///         ReplayCacheConfig::new()
///             .max_entries(50_000)
///             .max_bytes(64 * 1024 * 1024)
///             .max_age(Duration::from_secs(5)),
///     ))
///     .build();
/// # let _ = idempotency;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayCacheConfig {
    max_entries: usize,
    max_bytes: usize,
    max_age: Duration,
    completions: bool,
}

impl ReplayCacheConfig {
    /// The defaults: 16,384 entries, 32 MiB, 10 s maximum age, completions not cached.
    pub const fn new() -> Self {
        Self {
            max_entries: 16 * 1024,
            max_bytes: 32 * 1024 * 1024,
            max_age: Duration::from_secs(10),
            completions: false,
        }
    }

    /// Whether the records this process completes enter the cache as they complete
    /// (default: no). Without it, a key's first replay asks the store (one read) and
    /// its later replays are answered from the cache; with it, the first replay is
    /// answered from memory too, and every fresh key pays for an entry it will most
    /// likely never use: an insertion and an eviction of an older entry, a cost the
    /// HTTP benchmark shows on the SQLite store's fresh keys. Worth it
    /// where retries typically arrive within [`max_age`](Self::max_age) of the original
    /// and the store is far away. Over a store that keeps its records in memory itself
    /// ([`Capabilities::in_process`](crate::store::Capabilities::in_process)) completions are never
    /// cached: the store answers from memory already.
    pub const fn remember_completions(mut self, remember: bool) -> Self {
        self.completions = remember;
        self
    }

    /// How many records the cache keeps at most (default 16,384). Its maps grow with use
    /// up to this many.
    pub const fn max_entries(mut self, entries: usize) -> Self {
        self.max_entries = entries;
        self
    }

    /// How many bytes of keys, headers and bodies the cache keeps at most (default
    /// 32 MiB). A response larger than 1/32 of it is not cached.
    pub const fn max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// How long an entry is served at most before the store is asked again (default
    /// 10 s), whatever the record's TTL: after a record is deleted on one instance,
    /// another instance may replay it for this long.
    pub const fn max_age(mut self, age: Duration) -> Self {
        self.max_age = age;
        self
    }
}

impl Default for ReplayCacheConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// The time entries' deadlines are kept in, in milliseconds.
#[derive(Debug)]
enum CacheClock {
    /// The store's own clock (it decides expiry in this process).
    Store(Arc<dyn Clock>),
    /// Monotonic time since the cache was built.
    Monotonic(Instant),
}

impl CacheClock {
    fn now(&self) -> i64 {
        match self {
            Self::Store(clock) => clock.now_millis(),
            Self::Monotonic(start) => millis(start.elapsed()),
        }
    }
}

/// A cached replay: the completed record, compact (it outlives the requests around it,
/// see [`CompactResponse`]), and the response [`super::answers::replay`] builds from it,
/// built at the first replay (most completed keys are never replayed, so caching one
/// costs no header parsing) and cloned for every later one.
#[derive(Debug)]
pub(super) struct CachedReplay {
    stored: CompactResponse,
    built: OnceLock<(StatusCode, HeaderMap, Bytes)>,
}

impl CachedReplay {
    pub(super) fn new(stored: &StoredResponse) -> Self {
        Self {
            stored: CompactResponse::new(stored),
            built: OnceLock::new(),
        }
    }

    /// The replayed response (marked as a replay).
    pub(super) fn response(&self) -> Response {
        let (status, headers, body) = self.built.get_or_init(|| {
            let stored = self
                .stored
                .to_stored()
                .expect("headers this process encoded decode");
            super::answers::replay_parts(&stored)
        });
        let body_kept = self.stored.body.is_some();
        super::answers::assembled(*status, headers.clone(), body.clone(), body_kept)
    }

    /// The record this copy was made from.
    pub(super) fn to_stored(&self) -> StoredResponse {
        self.stored
            .to_stored()
            .expect("headers this process encoded decode")
    }

    /// The status replayed, for logs (as the response carries it).
    pub(super) fn status(&self) -> u16 {
        StatusCode::from_u16(self.stored.status)
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            .as_u16()
    }
}

/// What the cache knows of a request's key.
#[derive(Debug)]
pub(super) enum Cached {
    /// Completed with the request's fingerprint: answer with this.
    Hit(Arc<CachedReplay>),
    /// Completed with another fingerprint: `422`.
    Mismatch,
    /// Nothing (or nothing still valid): ask the store.
    Miss,
}

/// The engine's replay cache (see the module docs).
#[derive(Debug)]
pub(crate) struct ReplayCache {
    shards: Sharded<Shard>,
    clock: CacheClock,
    max_age: i64,
    shard_bytes: usize,
    completions: bool,
}

/// One shard: entries by `(scope, key)`, and their insertion order for eviction.
#[derive(Debug)]
struct Shard {
    entries: Table<Entry>,
    /// `(hash, seq)` oldest first; a pair whose entry was replaced or removed is skipped.
    order: VecDeque<(u64, u64)>,
    bytes: usize,
    next_seq: u64,
    /// This shard's share of the entry bound: the bound split evenly, the remainder one
    /// each to the first shards, so that the shards together never hold more.
    max_entries: usize,
}

#[derive(Debug)]
struct Entry {
    seq: u64,
    /// The scope and the key, then (once learned, in the id's tail) the framed bytes of a
    /// request verified against `fingerprint` ([`RequestFingerprint::framed_after`]): a
    /// request framed alike is the same request, and is answered without computing its
    /// fingerprint. One allocation, so that a replay's two compares read one run of memory.
    id: Id,
    fingerprint: Fingerprint,
    /// Cache time after which the entry is not served.
    expires_at: i64,
    size: usize,
    replay: Arc<CachedReplay>,
}

impl Entry {
    /// The framed bytes of the request the entry learned, if it has.
    fn request(&self) -> Option<&[u8]> {
        // A framing is never empty (it holds at least the mode's tag).
        Some(self.id.tail()).filter(|framed| !framed.is_empty())
    }
}

impl Identified for Entry {
    fn id(&self) -> &Id {
        &self.id
    }
}

impl ReplayCache {
    /// An empty cache within `config`'s bounds, on `store_clock` when the store keeps
    /// time in this process, otherwise on a monotonic clock. Over a store that keeps its
    /// records in this process (`store_in_process`) it never takes completions.
    pub(crate) fn new(
        config: ReplayCacheConfig,
        store_clock: Option<Arc<dyn Clock>>,
        store_in_process: bool,
    ) -> Self {
        let shard_bytes = config.max_bytes / SHARDS;
        let mut shard_index = 0;
        let clock = match store_clock {
            Some(clock) => CacheClock::Store(clock),
            None => CacheClock::Monotonic(Instant::now()),
        };
        Self {
            shards: Sharded::new(SHARDS, || {
                let max_entries = config.max_entries / SHARDS
                    + usize::from(shard_index < config.max_entries % SHARDS);
                shard_index += 1;
                Shard {
                    // Grown with use (see the module docs).
                    entries: Table::default(),
                    order: VecDeque::with_capacity(order_capacity(max_entries)),
                    bytes: 0,
                    next_seq: 0,
                    max_entries,
                }
            }),
            clock,
            max_age: millis(config.max_age),
            shard_bytes,
            completions: config.completions && !store_in_process,
        }
    }

    /// Whether this process's own completions are cached
    /// ([`ReplayCacheConfig::remember_completions`], over a store that does not keep its
    /// records in this process).
    pub(crate) fn remembers_completions(&self) -> bool {
        self.completions
    }

    /// The cache's time now: read it before the store call whose answer is cached.
    pub(crate) fn now(&self) -> i64 {
        self.clock.now()
    }

    /// What the cache knows of `(scope, key)` for `request`.
    ///
    /// A request framed exactly as the one the entry learned is a hit without hashing;
    /// any other is compared by its fingerprint (computed here if it was not yet), and
    /// the first hit so verified teaches the entry its request's bytes.
    pub(super) fn get(&self, scope: &str, key: &str, request: &RequestFingerprint) -> Cached {
        let id = self.shards.id(scope, key);
        let mut shard = self.shards.lock(id);
        let shard = &mut *shard;
        let Some(entry) = shard.entries.get_mut(id) else {
            return Cached::Miss;
        };
        // Read only for an entry found: a fresh key (most requests) reads no clock here.
        if entry.expires_at <= self.now() {
            shard.remove(id);
            return Cached::Miss;
        }
        if entry.request().is_some_and(|seen| request.is_framed(seen)) {
            return Cached::Hit(entry.replay.clone());
        }
        if entry.fingerprint != request.get() {
            return Cached::Mismatch;
        }
        let replay = entry.replay.clone();
        // Only a copy that keeps the entry within its shard's share: one that did not
        // would evict the shard's other entries, and then the entry itself.
        let room = self.shard_bytes.saturating_sub(entry.size);
        if entry.request().is_none()
            && let Some(text) =
                request.framed_after(entry.id.id_bytes(), MAX_REQUEST_COPY.min(room))
        {
            let learned = text.len() - entry.id.id_bytes().len();
            entry.size += learned;
            shard.bytes += learned;
            entry.id.replace_tail(text);
            shard.evict(self.shard_bytes);
        }
        Cached::Hit(replay)
    }

    /// Keeps the completed record of `id` until `lives_until` (cache time; see the module
    /// docs for how callers bound it), and no longer than the maximum age counted from
    /// `read_at`: the cache time before the store call that read or wrote the record was
    /// sent. Counted from the answer instead, a late answer would stretch how long a
    /// deleted record is replayed by the time the answer took. Returns the record ready
    /// to replay, whether the cache kept it or not (too large, or already past its life).
    pub(super) fn insert(
        &self,
        id: &ScopedKey,
        fingerprint: Fingerprint,
        stored: StoredResponse,
        lives_until: i64,
        read_at: i64,
    ) -> Arc<CachedReplay> {
        let (scope, key) = (id.scope(), id.key());
        let size = ENTRY_OVERHEAD
            + scope.len()
            + key.len()
            + stored.body.as_ref().map_or(0, Bytes::len)
            + stored
                .headers
                .iter()
                .map(|(name, value)| 2 * (name.len() + value.len()))
                .sum::<usize>();
        let replay = Arc::new(CachedReplay::new(&stored));
        let now = self.now();
        let expires_at = lives_until.min(read_at.min(now).saturating_add(self.max_age));
        if expires_at <= now || size > self.shard_bytes {
            return replay;
        }
        let hashed = self.shards.id(scope, key);
        let mut shard = self.shards.lock(hashed);
        if shard.max_entries == 0 {
            return replay;
        }
        let seq = shard.next_seq;
        shard.next_seq += 1;
        let entry = Entry {
            seq,
            id: Id::new(hashed),
            fingerprint,
            expires_at,
            size,
            replay: replay.clone(),
        };
        if let Some(replaced) = shard.entries.insert(entry) {
            shard.bytes -= replaced.size;
        }
        shard.order.push_back((hashed.hash(), seq));
        shard.bytes += size;
        shard.evict(self.shard_bytes);
        replay
    }

    /// Drops `(scope, key)` from the cache.
    pub(super) fn invalidate(&self, scope: &str, key: &str) {
        let id = self.shards.id(scope, key);
        self.shards.lock(id).remove(id);
    }

    /// How many entries the cache holds (expired ones until they are evicted or looked
    /// up).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.usage().records
    }

    /// Its entries (expired ones until they are evicted or looked up) and the bytes it
    /// counts against its byte bound for them: each entry's scope, key, headers (twice:
    /// stored and built), body and learned request copy, plus a fixed overhead per entry
    /// for its map and queue slots and its replay. Locks each shard in turn.
    pub(crate) fn usage(&self) -> MemoryUsage {
        self.shards
            .each()
            .fold(MemoryUsage::default(), |usage, shard| MemoryUsage {
                records: usage.records + shard.entries.len(),
                bytes: usage.bytes + shard.bytes,
            })
    }
}

/// The insertion queue's size: room for every live entry plus as many stale pairs
/// (replaced or removed entries) before it is compacted, so it never grows.
fn order_capacity(shard_entries: usize) -> usize {
    2 * shard_entries + 16
}

impl Shard {
    fn remove(&mut self, id: HashedId<'_>) {
        if let Some(old) = self.entries.remove(id) {
            self.bytes -= old.size;
        }
    }

    /// Evicts the oldest entries until the shard is within its bounds: its share of the
    /// entries and `max_bytes`.
    fn evict(&mut self, max_bytes: usize) {
        let max_entries = self.max_entries;
        while self.entries.len() > max_entries || self.bytes > max_bytes {
            let Some((hash, seq)) = self.order.pop_front() else {
                break;
            };
            if let Some(oldest) = self.entries.find_entry(hash, |e| e.seq == seq) {
                let (oldest, _) = oldest.remove();
                self.bytes -= oldest.size;
            }
        }
        // Stale pairs accumulate when entries are replaced or invalidated: drop them
        // before the queue would have to grow.
        if self.order.len() + 1 >= order_capacity(max_entries) {
            let entries = &self.entries;
            self.order
                .retain(|&(hash, seq)| entries.find(hash, |e| e.seq == seq).is_some());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn fingerprint(n: u8) -> Fingerprint {
        Fingerprint {
            version: 1,
            digest: [n; 32],
        }
    }

    fn stored(body: &str) -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: vec![("location".to_owned(), b"/x".to_vec())],
            body: Some(Bytes::copy_from_slice(body.as_bytes())),
        }
    }

    fn new_cache(config: ReplayCacheConfig) -> (ReplayCache, ManualClock) {
        let clock = ManualClock::new();
        (
            ReplayCache::new(config, Some(Arc::new(clock.clone())), false),
            clock,
        )
    }

    #[test]
    fn hits_mismatches_and_misses() {
        let (cache, _) = new_cache(ReplayCacheConfig::new());
        let until = cache.now() + 60_000;
        cache.insert(
            &ScopedKey::new("s", "k"),
            fingerprint(1),
            stored("a"),
            until,
            cache.now(),
        );
        match cache.get("s", "k", &fingerprint(1).into()) {
            Cached::Hit(replay) => {
                let response = replay.response();
                assert_eq!(response.status(), StatusCode::CREATED);
                assert_eq!(response.headers()["location"], "/x");
                assert_eq!(response.headers()[super::super::REPLAYED_HEADER], "true");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            cache.get("s", "k", &fingerprint(2).into()),
            Cached::Mismatch
        ));
        // Scope and key are framed apart.
        assert!(matches!(
            cache.get("sk", "", &fingerprint(1).into()),
            Cached::Miss
        ));
        assert!(matches!(
            cache.get("", "sk", &fingerprint(1).into()),
            Cached::Miss
        ));
        cache.invalidate("s", "k");
        assert!(matches!(
            cache.get("s", "k", &fingerprint(1).into()),
            Cached::Miss
        ));
    }

    #[test]
    fn never_serves_past_the_record_or_the_maximum_age() {
        let (cache, clock) = new_cache(ReplayCacheConfig::new().max_age(Duration::from_secs(10)));
        let now = cache.now();
        cache.insert(
            &ScopedKey::new("s", "short"),
            fingerprint(1),
            stored("a"),
            now + 2_000,
            now,
        );
        cache.insert(
            &ScopedKey::new("s", "long"),
            fingerprint(1),
            stored("a"),
            now + 3_600_000,
            now,
        );
        cache.insert(
            &ScopedKey::new("s", "gone"),
            fingerprint(1),
            stored("a"),
            now,
            now,
        );
        assert!(matches!(
            cache.get("s", "gone", &fingerprint(1).into()),
            Cached::Miss
        ));
        clock.advance(Duration::from_millis(1_999));
        assert!(matches!(
            cache.get("s", "short", &fingerprint(1).into()),
            Cached::Hit(_)
        ));
        clock.advance(Duration::from_millis(1));
        assert!(matches!(
            cache.get("s", "short", &fingerprint(1).into()),
            Cached::Miss
        ));
        assert!(matches!(
            cache.get("s", "long", &fingerprint(1).into()),
            Cached::Hit(_)
        ));
        clock.advance(Duration::from_secs(8));
        assert!(matches!(
            cache.get("s", "long", &fingerprint(1).into()),
            Cached::Miss
        ));
    }

    #[test]
    fn an_entry_knows_its_scope_and_key_apart_and_keeps_them_with_the_request_it_learned() {
        let (cache, _) = new_cache(ReplayCacheConfig::new());
        let original = order(r#"{"amount": 1}"#);
        cache.insert(
            &ScopedKey::new("ab", "c"),
            original.get(),
            stored("a"),
            cache.now() + 60_000,
            cache.now(),
        );
        let entry_is = |scope: &str, key: &str, learned: bool| {
            let id = cache.shards.id("ab", "c");
            let shard = cache.shards.lock(id);
            let entry = shard.entries.get(id).expect("cached");
            assert_eq!(entry.request().is_some(), learned);
            entry.id.is(cache.shards.id(scope, key))
        };
        assert!(entry_is("ab", "c", false));
        // The seam is part of the identity: ("ab", "c") is not ("a", "bc").
        assert!(!entry_is("a", "bc", false));
        assert!(!entry_is("ab", "cd", false));
        assert!(!entry_is("ab", "", false));
        // Learning the request's bytes keeps the id in front of them.
        assert!(matches!(
            cache.get("ab", "c", &order(r#"{"amount": 1}"#)),
            Cached::Hit(_)
        ));
        assert!(entry_is("ab", "c", true));
        assert!(!entry_is("a", "bc", true));
        assert!(
            !entry_is("ab", "c{", true),
            "the request's bytes are no part of the key"
        );
        let again = order(r#"{"amount": 1}"#);
        assert!(matches!(cache.get("ab", "c", &again), Cached::Hit(_)));
        assert!(!again.is_computed(), "answered by the learned bytes");
    }

    #[test]
    fn its_maps_grow_with_use_not_to_the_bound_up_front() {
        let (cache, _) = new_cache(ReplayCacheConfig::new().max_entries(SHARDS * 4096));
        for shard in cache.shards.each() {
            assert!(shard.entries.capacity() < 64);
        }
        let until = cache.now() + 60_000;
        for i in 0..SHARDS * 8 {
            let id = ScopedKey::new("s", &format!("k{i}"));
            cache.insert(&id, fingerprint(1), stored("a"), until, cache.now());
        }
        // 8 entries a shard on average: nowhere near a table for 4,096.
        let largest = cache.shards.each().map(|shard| shard.entries.capacity());
        assert!(largest.max().unwrap() < 256);
        assert_eq!(cache.len(), SHARDS * 8);
    }

    #[test]
    fn stays_within_its_bounds_oldest_out_first() {
        let (cache, _) = new_cache(ReplayCacheConfig::new().max_entries(SHARDS * 4));
        let until = cache.now() + 60_000;
        for i in 0..10_000 {
            cache.insert(
                &ScopedKey::new("s", &format!("k{i}")),
                fingerprint(1),
                stored("a"),
                until,
                cache.now(),
            );
            // Replacing and invalidating leave stale queue pairs behind.
            cache.insert(
                &ScopedKey::new("s", &format!("k{i}")),
                fingerprint(1),
                stored("b"),
                until,
                cache.now(),
            );
            if i % 3 == 0 {
                cache.invalidate("s", &format!("k{i}"));
            }
        }
        assert!(cache.len() <= SHARDS * 4, "{}", cache.len());
        assert!(matches!(
            cache.get("s", "k9998", &fingerprint(1).into()),
            Cached::Hit(_)
        ));
        assert!(matches!(
            cache.get("s", "k0", &fingerprint(1).into()),
            Cached::Miss
        ));
        for shard in cache.shards.each() {
            assert!(shard.order.capacity() <= order_capacity(4).next_power_of_two());
            assert_eq!(
                shard.bytes,
                shard.entries.iter().map(|e| e.size).sum::<usize>()
            );
        }

        let (small, _) = new_cache(ReplayCacheConfig::new().max_bytes(SHARDS * 1024));
        let big = "x".repeat(2048);
        small.insert(
            &ScopedKey::new("s", "big"),
            fingerprint(1),
            stored(&big),
            until,
            small.now(),
        );
        assert!(matches!(
            small.get("s", "big", &fingerprint(1).into()),
            Cached::Miss
        ));
        for i in 0..100 {
            small.insert(
                &ScopedKey::new("s", &format!("k{i}")),
                fingerprint(1),
                stored("a"),
                until,
                small.now(),
            );
        }
        for shard in small.shards.each() {
            assert!(shard.bytes <= 1024);
        }
    }

    fn order(body: &str) -> RequestFingerprint {
        RequestFingerprint::new(
            crate::FingerprintMode::Json,
            http::Method::POST,
            http::Uri::from_static("/orders"),
            Bytes::copy_from_slice(body.as_bytes()),
        )
    }

    #[test]
    fn a_replay_framed_like_a_verified_one_is_answered_without_hashing() {
        let (cache, _) = new_cache(ReplayCacheConfig::new());
        let original = order(r#"{"amount": 1}"#);
        let id = ScopedKey::new("s", "k");
        cache.insert(
            &id,
            original.get(),
            stored("a"),
            cache.now() + 60_000,
            cache.now(),
        );
        let entry_bytes = |cache: &ReplayCache| {
            let id = cache.shards.id("s", "k");
            let shard = cache.shards.lock(id);
            (shard.entries.get(id).expect("cached").size, shard.bytes)
        };
        let (size_before, _) = entry_bytes(&cache);

        // The first replay is verified by its fingerprint, and teaches the entry its bytes.
        let first = order(r#"{"amount": 1}"#);
        assert!(matches!(cache.get("s", "k", &first), Cached::Hit(_)));
        assert!(first.is_computed());
        let (size, shard_bytes) = entry_bytes(&cache);
        let learned = first.framed(usize::MAX).unwrap().len();
        assert_eq!(
            size,
            size_before + learned,
            "the copy counts against the bound"
        );
        assert_eq!(shard_bytes, size);

        // Later ones framed alike hash nothing.
        let again = order(r#"{"amount": 1}"#);
        assert!(matches!(cache.get("s", "k", &again), Cached::Hit(_)));
        assert!(!again.is_computed());

        // The same JSON written otherwise is still the same request, by its fingerprint,
        // and does not replace what the entry learned.
        let respaced = order(r#"{ "amount" : 1 }"#);
        assert!(matches!(cache.get("s", "k", &respaced), Cached::Hit(_)));
        assert!(respaced.is_computed());
        assert_eq!(entry_bytes(&cache).0, size);

        // Another request is a mismatch, learned bytes or not.
        for other in [
            order(r#"{"amount": 2}"#),
            order(""),
            order(r#"{"amount": 1} "#.trim_end()),
        ] {
            let expected_hit = other.get() == original.get();
            let answer = cache.get("s", "k", &other);
            assert_eq!(matches!(answer, Cached::Hit(_)), expected_hit, "{other:?}");
        }
        let on_another_path = RequestFingerprint::new(
            crate::FingerprintMode::Json,
            http::Method::POST,
            http::Uri::from_static("/refunds"),
            Bytes::from_static(br#"{"amount": 1}"#),
        );
        assert!(matches!(
            cache.get("s", "k", &on_another_path),
            Cached::Mismatch
        ));
        // A fingerprint without its request is compared by digest, as before.
        assert!(matches!(
            cache.get("s", "k", &original.get().into()),
            Cached::Hit(_)
        ));
    }

    #[test]
    fn a_request_too_large_to_copy_is_always_verified_by_its_fingerprint() {
        let (cache, _) = new_cache(ReplayCacheConfig::new());
        let body = format!(r#"{{"note": "{}"}}"#, "x".repeat(MAX_REQUEST_COPY));
        let id = ScopedKey::new("s", "k");
        cache.insert(
            &id,
            order(&body).get(),
            stored("a"),
            cache.now() + 60_000,
            cache.now(),
        );
        for _ in 0..2 {
            let replay = order(&body);
            assert!(matches!(cache.get("s", "k", &replay), Cached::Hit(_)));
            assert!(replay.is_computed());
        }
    }

    #[test]
    fn a_request_copy_never_pushes_its_entry_past_the_shard_share() {
        // 2 KiB a shard: the entry fits, a copy of its 4 KiB request would not.
        let config = ReplayCacheConfig::new().max_bytes(SHARDS * 2048);
        let (cache, _) = new_cache(config);
        let body = format!(r#"{{"note": "{}"}}"#, "x".repeat(4096));
        let id = ScopedKey::new("s", "k");
        cache.insert(
            &id,
            order(&body).get(),
            stored("a"),
            cache.now() + 60_000,
            cache.now(),
        );
        for _ in 0..3 {
            let replay = order(&body);
            assert!(matches!(cache.get("s", "k", &replay), Cached::Hit(_)));
            assert!(
                replay.is_computed(),
                "verified by fingerprint, nothing learned"
            );
        }
        let id = cache.shards.id("s", "k");
        let shard = cache.shards.lock(id);
        assert!(shard.entries.get(id).expect("cached").request().is_none());
        assert!(shard.bytes <= 2048);
    }

    /// Four times as many distinct keys as the entry bound, with a realistic response
    /// (several times the byte bound): the cache's entries and accounted bytes never pass
    /// its bounds, whichever of the two binds first.
    #[test]
    fn many_distinct_keys_stay_within_the_configured_bounds() {
        const KEYS: u32 = 200_000;
        let key_of = |n: u32| format!("{n:08x}-0000-4000-8000-{n:012}");
        let response = StoredResponse {
            status: 201,
            headers: vec![
                ("content-type".to_owned(), b"application/json".to_vec()),
                ("location".to_owned(), b"/orders/ord_000000012345".to_vec()),
            ],
            body: Some(Bytes::from(vec![b'x'; 240])),
        };
        // Neither bound a multiple of the shard count.
        let by_entries = ReplayCacheConfig::new()
            .max_entries(50_000)
            .max_bytes(1 << 30);
        let by_bytes = ReplayCacheConfig::new()
            .max_entries(1 << 20)
            .max_bytes(10_000_000);
        for config in [by_entries, by_bytes] {
            let (cache, _) = new_cache(config);
            let until = cache.now() + 60_000;
            for n in 0..KEYS {
                let key = key_of(n);
                cache.insert(
                    &ScopedKey::new("acct_1Pq8ZxL2mN4vR7tY", &key),
                    fingerprint(1),
                    response.clone(),
                    until,
                    cache.now(),
                );
                if n % 10_000 == 9_999 {
                    let usage = cache.usage();
                    assert!(
                        usage.records <= config.max_entries,
                        "{} entries, bound {}",
                        usage.records,
                        config.max_entries
                    );
                    assert!(
                        usage.bytes <= config.max_bytes,
                        "{} bytes, bound {}",
                        usage.bytes,
                        config.max_bytes
                    );
                }
            }
            let usage = cache.usage();
            assert_eq!(usage.records, cache.len());
            let per_entry = usage.bytes_per_record().expect("entries");
            assert!(
                per_entry >= ENTRY_OVERHEAD + 20 + 36 + 240,
                "each entry accounts for its overhead, scope, key and body: {per_entry}"
            );
            // Full: the binding bound is nearly reached (each shard within one entry).
            let full = (usage.records + SHARDS >= config.max_entries)
                || (usage.bytes + SHARDS * per_entry >= config.max_bytes);
            assert!(full, "{usage:?} fills {config:?}");
            let newest = key_of(KEYS - 1);
            assert!(matches!(
                cache.get("acct_1Pq8ZxL2mN4vR7tY", &newest, &fingerprint(1).into()),
                Cached::Hit(_)
            ));
        }
    }

    #[test]
    fn a_disabled_size_caches_nothing() {
        let (cache, _) = new_cache(ReplayCacheConfig::new().max_entries(0));
        cache.insert(
            &ScopedKey::new("s", "k"),
            fingerprint(1),
            stored("a"),
            cache.now() + 60_000,
            cache.now(),
        );
        assert!(matches!(
            cache.get("s", "k", &fingerprint(1).into()),
            Cached::Miss
        ));
    }
}
