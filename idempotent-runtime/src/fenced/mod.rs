//! The protocol over a fenced record store: [`Fenced`] runs it over any
//! [`RecordStore`] as a [`Store`], every decision taken by the pure functions of
//! [`rules`] on the record and the store's [`StoreNow`]. This is the only place the
//! protocol's rules live; the stores (`crate::store`) hold records and compare versions,
//! and the protocol model calls the same functions (`testing::protocol`).
//!
//! Round trips: a fresh key one (`insert`); a duplicate one (the insert answers the
//! record it found); a takeover two (`insert`, then `update`); a renewal, a step and a
//! completion one each (an `update` with the version of the owner's last write, which
//! [`Fenced`] remembers; a second when it did not know it).

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::store::{
    Capabilities, Change, ClaimAnswer, ClaimOutcome, ClaimRequest, FencingToken, ForgetOutcome,
    Inserted, KeyedRecord, Record, RecordBody, RecordInfo, RecordStore, RecordedStep, Store,
    StoreError, StoreNow, StoredResponse, Updated, decode_steps, encode_step,
    retry_after_from_millis,
};
use rules::{Decision, steps_survive};

pub mod rules;
#[cfg(feature = "sql")]
mod tx;

/// How many times a decision is taken again when the record changed under it before a
/// store error is reported. Each lost attempt is another write's success, and the writes
/// that win are finite (a claim's, or its owner's steps and renewals: an owner recording
/// several steps at once, or a takeover racing a lost owner that still records steps,
/// loses many in a row), so the bound only stops a runaway.
const ATTEMPTS: usize = 256;

/// The protocol over a [`RecordStore`]: a [`Store`] whose every decision is one of the
/// engine's pure functions (see the module docs). A clone shares the records.
#[derive(Debug)]
pub struct Fenced<R> {
    /// Shared with the transactional side ([`Fenced::transactions`]).
    records: Arc<R>,
    /// Shared with the transactional side, whose writes inside a handler's transaction
    /// are the same owner's.
    owned: Arc<Owned>,
}

impl<R> Clone for Fenced<R> {
    fn clone(&self) -> Self {
        Self {
            records: Arc::clone(&self.records),
            owned: Arc::clone(&self.owned),
        }
    }
}

/// The version of each in-progress record after its owner's last write, by the owner's
/// token (unique to its claim), so that the owner's next write is one compare-and-set.
/// Only a hint: a wrong version costs a stale compare-and-set and one more, never a
/// wrong write.
#[derive(Debug, Default)]
struct Owned(Mutex<OwnedVersions>);

/// The versions of [`Owned`], by token.
type OwnedVersions = HashMap<FencingToken, u64, BuildHasherDefault<TokenHasher>>;

/// Hashes the owners' tokens: they are random ([`FencingToken::random`]), so their bits
/// need no keyed hash to spread, and a keyed one would cost three per request.
#[derive(Debug, Default)]
struct TokenHasher(u64);

impl Hasher for TokenHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(SPREAD);
        }
    }

    fn write_i64(&mut self, token: i64) {
        self.0 = u64::from_ne_bytes(token.to_ne_bytes()).wrapping_mul(SPREAD);
    }
}

/// An odd constant (2^64 / φ) whose product carries every bit of a token into the high
/// bits the map's control bytes take.
const SPREAD: u64 = 0x9E37_79B9_7F4A_7C15;

impl Owned {
    fn map(&self) -> std::sync::MutexGuard<'_, OwnedVersions> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn remember(&self, token: FencingToken, version: u64) {
        self.map().insert(token, version);
    }

    fn forget(&self, token: FencingToken) {
        self.map().remove(&token);
    }

    /// The owner's last version; a completion takes it out, since it ends what the token
    /// owns and no later write may find its version.
    fn known(&self, token: FencingToken, last: bool) -> Option<u64> {
        if last {
            self.map().remove(&token)
        } else {
            self.map().get(&token).copied()
        }
    }
}

/// The two operations an owner's write needs, on the records directly or inside a
/// handler's transaction ([`tx`]).
trait Access: Send {
    /// [`RecordStore::read`].
    fn read<'a>(
        &'a mut self,
        scope: &'a str,
        key: &'a str,
    ) -> impl Future<Output = Result<(Option<Record>, StoreNow), StoreError>> + Send + 'a;

    /// [`RecordStore::update`].
    fn update<'a>(
        &'a mut self,
        scope: &'a str,
        key: &'a str,
        version: u64,
        change: &'a Change<'a>,
    ) -> impl Future<Output = Result<Updated, StoreError>> + Send + 'a;
}

/// The records themselves.
struct Direct<'r, R>(&'r R);

impl<R: RecordStore> Access for Direct<'_, R> {
    fn read<'a>(
        &'a mut self,
        scope: &'a str,
        key: &'a str,
    ) -> impl Future<Output = Result<(Option<Record>, StoreNow), StoreError>> + Send + 'a {
        self.0.read(scope, key)
    }

    fn update<'a>(
        &'a mut self,
        scope: &'a str,
        key: &'a str,
        version: u64,
        change: &'a Change<'a>,
    ) -> impl Future<Output = Result<Updated, StoreError>> + Send + 'a {
        self.0.update(scope, key, version, change)
    }
}

/// Applies the owner's `change` to the record `token` holds: one compare-and-set on the
/// version of its last write, again on the version the store answers while the token
/// still owns the record. `Ok(false)`: it owns nothing.
async fn owner_writes<A: Access>(
    owned: &Owned,
    access: &mut A,
    (scope, key): (&str, &str),
    token: FencingToken,
    change: &Change<'_>,
) -> Result<bool, StoreError> {
    let last = matches!(change, Change::Complete(_));
    let mut version = match owned.known(token, last) {
        Some(version) => version,
        None => match access.read(scope, key).await? {
            (Some(record), _) if rules::owned_by(&record, token) => record.version,
            _ => return Ok(false),
        },
    };
    for _ in 0..ATTEMPTS {
        match access.update(scope, key, version, change).await? {
            Updated::Updated(now_at) => {
                if last {
                    // A renewal that raced the completion may have remembered a version.
                    owned.forget(token);
                } else {
                    owned.remember(token, now_at);
                }
                return Ok(true);
            }
            Updated::Stale(Some(record), _) if rules::owned_by(&record, token) => {
                version = record.version;
            }
            Updated::Stale(..) => {
                owned.forget(token);
                return Ok(false);
            }
        }
    }
    Err(contention(scope, key))
}

impl<R: RecordStore> Fenced<R> {
    /// The protocol over `records`.
    pub fn new(records: R) -> Self {
        Self {
            records: Arc::new(records),
            owned: Arc::default(),
        }
    }

    /// The record store.
    pub fn records(&self) -> &R {
        &self.records
    }

    fn remember(&self, token: FencingToken, version: u64) {
        self.owned.remember(token, version);
    }

    fn forget_version(&self, token: FencingToken) {
        self.owned.forget(token);
    }

    /// Applies the owner's `change` ([`owner_writes`]) through the records.
    async fn owner_writes(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        change: &Change<'_>,
    ) -> Result<bool, StoreError> {
        owner_writes(
            &self.owned,
            &mut Direct(&*self.records),
            (scope, key),
            token,
            change,
        )
        .await
    }
}

fn contention(scope: &str, key: &str) -> StoreError {
    StoreError::backend(format!(
        "the record of ({scope:?}, {key:?}) changed under {ATTEMPTS} decisions in a row"
    ))
}

#[async_trait]
impl<R: RecordStore> Store for Fenced<R> {
    async fn claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimAnswer, StoreError> {
        let (scope, key) = (claim.scope, claim.key);
        // The record a stale takeover found instead: decided on at once.
        let mut found = None;
        for _ in 0..ATTEMPTS {
            let (record, now) = match found.take() {
                Some(found) => found,
                None => match self.records.insert(claim).await? {
                    Inserted::Inserted => {
                        self.remember(claim.token, Record::first_version(claim.token));
                        return Ok(ClaimOutcome::Claimed {
                            token: claim.token,
                            takeover: None,
                            steps: Vec::new(),
                        }
                        .into());
                    }
                    Inserted::Exists(record, now) => (record, now),
                    // Each time, a delete (a release, a purge) won: finite, as below.
                    Inserted::Gone => continue,
                },
            };
            let reason = match rules::claim(&record, now, claim.fingerprint) {
                Decision::Take(reason) => reason,
                Decision::Mismatch => return Ok(ClaimOutcome::Mismatch.into()),
                Decision::Replay | Decision::InProgress => return answer(record, now),
            };
            let keep = steps_survive(reason);
            let take_over = Change::TakeOver {
                claim,
                keep_steps: keep,
            };
            match self
                .records
                .update(scope, key, record.version, &take_over)
                .await?
            {
                Updated::Updated(version) => {
                    self.remember(claim.token, version);
                    let steps = match &record.body {
                        RecordBody::InProgress { steps, .. } if keep => decode_steps(steps)?,
                        _ => Vec::new(),
                    };
                    return Ok(ClaimOutcome::Claimed {
                        token: claim.token,
                        takeover: Some(reason),
                        steps,
                    }
                    .into());
                }
                // Another writer changed the record since it was read: decide again, on
                // the record as it is (gone: insert again).
                Updated::Stale(record, now) => found = record.map(|record| (record, now)),
            }
        }
        Err(contention(scope, key))
    }

    async fn renew(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        lease: Duration,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        // **A renewal sent is carried to its end**, even when the heartbeat stops waiting
        // for it (its store timeout, behind a held lock): the owner's renewals then queue
        // up at the version of its last known write, and when the first of them lands the
        // others are stale. Abandoned there, the lease would end at the first renewal's
        // end, not the last's, and a retry queued behind the same lock would take a live
        // handler over. Carried on, each reads the record again and applies while the
        // token still owns it.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return self
                .owner_writes(scope, key, token, &Change::Renew { lease, ttl })
                .await;
        };
        let this = self.clone();
        let (scope, key) = (scope.to_owned(), key.to_owned());
        runtime
            .spawn(async move {
                this.owner_writes(&scope, &key, token, &Change::Renew { lease, ttl })
                    .await
            })
            .await
            .map_err(|e| StoreError::backend(format!("a renewal's task failed: {e}")))?
    }

    async fn complete(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        // The version is taken out of the cache as the completion is sent (`Owned::known`).
        self.owner_writes(scope, key, token, &Change::Complete(response))
            .await
    }

    async fn record_step(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        step: &RecordedStep,
    ) -> Result<bool, StoreError> {
        let step = encode_step(step);
        self.owner_writes(scope, key, token, &Change::AppendStep(&step))
            .await
    }

    async fn release(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        self.forget_version(token);
        for _ in 0..ATTEMPTS {
            let record = match self.records.read(scope, key).await? {
                (Some(record), _) if rules::owned_by(&record, token) => record,
                _ => return Ok(false),
            };
            let done = match rules::release(&record) {
                rules::Release::Delete => self.records.delete(scope, key, record.version).await?,
                rules::Release::EndLease => matches!(
                    self.records
                        .update(scope, key, record.version, &Change::EndLease)
                        .await?,
                    Updated::Updated(_)
                ),
            };
            if done {
                return Ok(true);
            }
        }
        Err(contention(scope, key))
    }

    async fn purge_expired(&self, limit: u32) -> Result<u64, StoreError> {
        let (candidates, now) = self.records.past_expiry(limit).await?;
        let expired: Vec<(&str, &str, u64)> = candidates
            .iter()
            .filter(|candidate| rules::expired(&candidate.record, now))
            .map(|KeyedRecord { scope, key, record }| (&**scope, &**key, record.version))
            .collect();
        if expired.is_empty() {
            return Ok(0);
        }
        // A record changed since it was read (renewed, taken over) is at another version
        // now, and stays.
        self.records.delete_many(&expired).await
    }

    async fn inspect(&self, scope: &str, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        match self.records.read(scope, key).await? {
            (Some(record), now) => rules::inspect(&record, now),
            (None, _) => Ok(None),
        }
    }

    async fn forget(
        &self,
        scope: &str,
        key: &str,
        force: bool,
    ) -> Result<ForgetOutcome, StoreError> {
        for _ in 0..ATTEMPTS {
            let (record, now) = match self.records.read(scope, key).await? {
                (Some(record), now) => (record, now),
                (None, _) => return Ok(ForgetOutcome::NotFound),
            };
            let outcome = match rules::forget(&record, now, force)? {
                rules::Forget::Refuse(lease_left) => {
                    return Ok(ForgetOutcome::Refused { lease_left });
                }
                rules::Forget::DeleteExpired => ForgetOutcome::NotFound,
                rules::Forget::Delete(info) => ForgetOutcome::Forgotten(info),
            };
            // The forgotten owner's cached version compares stale from now on.
            if self.records.delete(scope, key, record.version).await? {
                return Ok(outcome);
            }
        }
        Err(contention(scope, key))
    }

    fn capabilities(&self) -> Capabilities {
        self.records.capabilities()
    }
}

/// A duplicate's answer from the record it found: its replay, with how long the record
/// lives on, or how long the running claim's lease has left.
fn answer(record: Record, now: StoreNow) -> Result<ClaimAnswer, StoreError> {
    match record.body {
        RecordBody::Completed(response) => Ok(ClaimAnswer {
            outcome: ClaimOutcome::Replay(response),
            replay_lives_for: Some(Duration::from_millis(
                u64::try_from(record.expires_at.saturating_sub(now.wall_millis)).unwrap_or(0),
            )),
        }),
        RecordBody::InProgress {
            lease_expires_at, ..
        } => Ok(ClaimOutcome::InProgress {
            retry_after: retry_after_from_millis(lease_expires_at - now.lease_millis),
        }
        .into()),
    }
}
