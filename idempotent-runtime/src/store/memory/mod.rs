//! [`MemoryStore`]: the fenced record seam ([`Fenced`]) over [`MemoryRecords`], records
//! in a sharded, mutex-guarded map of this process.
//!
//! **Single process only.** Two instances of an app each have their own map, so a retry
//! landing on the other instance runs the handler again, and a restart forgets every
//! key. Use it for tests and single-process demos; use `SqliteStore` on one host and
//! `PostgresStore` across hosts.
//!
//! Like every store on the seam it decides nothing: [`Fenced`] takes every decision with
//! the engine's pure functions, and [`MemoryRecords`] inserts, reads, compares-and-sets
//! and deletes records.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::{
    Capabilities, ClaimAnswer, ClaimRequest, FencingToken, ForgetOutcome, MemoryUsage, RecordInfo,
    RecordedStep, Store, StoreError, StoredResponse,
};
use crate::clock::{Clock, SystemClock};
use crate::fenced::Fenced;

mod records;

pub use records::MemoryRecords;

/// An in-memory [`Store`] for tests and single-process demos (see the module docs). A
/// clone shares the records.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    fenced: Fenced<MemoryRecords>,
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An empty store on `clock`: TTLs on its wall clock, leases on its monotonic one
    /// ([`Clock::monotonic_millis`]).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            fenced: Fenced::new(MemoryRecords::new(clock)),
        }
    }

    /// The records under the protocol.
    pub fn records(&self) -> &MemoryRecords {
        self.fenced.records()
    }

    /// How many records the store holds (expired ones included until purged).
    pub fn len(&self) -> usize {
        self.records().len()
    }

    /// Whether the store holds no records.
    pub fn is_empty(&self) -> bool {
        self.records().is_empty()
    }

    /// The records the store holds (expired ones included until purged) and the heap
    /// bytes they take, counted from what they hold: every slot of the maps' tables
    /// (used or not: a table grows by doubling and never shrinks) at the size of a record
    /// plus its control byte, and each record's scope and key, steps, stored headers and
    /// body. Allocator headers and rounding are not counted, and a body is counted at its
    /// length even where its buffer is larger or shared. It walks every record, one shard
    /// locked at a time: an operator's call, not one per request.
    pub fn memory_usage(&self) -> MemoryUsage {
        self.records().memory_usage()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

/// What [`Store`]'s methods return once `#[async_trait]` has expanded them.
type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Each operation is [`Fenced`]'s, its future handed on as it is: the memory store is the
/// one whose per-request cost the benchmarks count, and wrapping the future in a box of
/// its own (as an `async fn` here would) costs an allocation per operation.
impl Store for MemoryStore {
    fn claim<'s, 'c, 'r, 'a>(&'s self, claim: &'c ClaimRequest<'r>) -> Answer<'a, ClaimAnswer>
    where
        's: 'a,
        'c: 'a,
        'r: 'a,
        Self: 'a,
    {
        self.fenced.claim(claim)
    }

    fn renew<'s, 'k1, 'k2, 'a>(
        &'s self,
        scope: &'k1 str,
        key: &'k2 str,
        token: FencingToken,
        lease: Duration,
        ttl: Duration,
    ) -> Answer<'a, bool>
    where
        's: 'a,
        'k1: 'a,
        'k2: 'a,
        Self: 'a,
    {
        self.fenced.renew(scope, key, token, lease, ttl)
    }

    fn complete<'s, 'k1, 'k2, 'r, 'a>(
        &'s self,
        scope: &'k1 str,
        key: &'k2 str,
        token: FencingToken,
        response: &'r StoredResponse,
    ) -> Answer<'a, bool>
    where
        's: 'a,
        'k1: 'a,
        'k2: 'a,
        'r: 'a,
        Self: 'a,
    {
        self.fenced.complete(scope, key, token, response)
    }

    fn record_step<'s, 'k1, 'k2, 'r, 'a>(
        &'s self,
        scope: &'k1 str,
        key: &'k2 str,
        token: FencingToken,
        step: &'r RecordedStep,
    ) -> Answer<'a, bool>
    where
        's: 'a,
        'k1: 'a,
        'k2: 'a,
        'r: 'a,
        Self: 'a,
    {
        self.fenced.record_step(scope, key, token, step)
    }

    fn release<'s, 'k1, 'k2, 'a>(
        &'s self,
        scope: &'k1 str,
        key: &'k2 str,
        token: FencingToken,
    ) -> Answer<'a, bool>
    where
        's: 'a,
        'k1: 'a,
        'k2: 'a,
        Self: 'a,
    {
        self.fenced.release(scope, key, token)
    }

    fn purge_expired<'s, 'a>(&'s self, limit: u32) -> Answer<'a, u64>
    where
        's: 'a,
        Self: 'a,
    {
        self.fenced.purge_expired(limit)
    }

    fn inspect<'s, 'k1, 'k2, 'a>(
        &'s self,
        scope: &'k1 str,
        key: &'k2 str,
    ) -> Answer<'a, Option<RecordInfo>>
    where
        's: 'a,
        'k1: 'a,
        'k2: 'a,
        Self: 'a,
    {
        self.fenced.inspect(scope, key)
    }

    fn forget<'s, 'k1, 'k2, 'a>(
        &'s self,
        scope: &'k1 str,
        key: &'k2 str,
        force: bool,
    ) -> Answer<'a, ForgetOutcome>
    where
        's: 'a,
        'k1: 'a,
        'k2: 'a,
        Self: 'a,
    {
        self.fenced.forget(scope, key, force)
    }

    fn capabilities(&self) -> Capabilities {
        self.fenced.capabilities()
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::clock::ManualClock;
    use crate::fingerprint::Fingerprint;
    use crate::store::{ClaimOutcome, encode_headers};

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
        let slot = MemoryRecords::slot_bytes();
        assert!(usage.bytes >= heap + 2000 * slot, "{usage:?}");
        // Tables at most double what they hold, plus a slack of small tables per shard.
        assert!(
            usage.bytes <= heap + 2 * 2000 * slot + records::SHARDS * 16 * slot,
            "{usage:?}"
        );
        assert!(usage.bytes_per_record().unwrap() >= heap / 2000 + slot);
    }
}
