//! The fenced record seam: what a store implements. A [`RecordStore`] keeps one
//! [`Record`] per `(scope, key)` and changes it only by compare-and-set on the record's
//! version; the protocol over it ([`Fenced`](crate::fenced::Fenced)) makes it a
//! [`Store`](super::Store).
//!
//! A store written against this seam decides nothing: it inserts a record unless one is
//! there, reads one, applies a [`Change`] when the version it was given is still the
//! record's (bumping it), deletes by version, and lists records past their expiry. The
//! takeover rule, which steps survive, whether a release keeps the record, what
//! `forget` and `inspect` see and what the sweeper may delete are the engine's, once
//! ([`crate::fenced`]).

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

#[cfg(feature = "sql")]
use super::TxDatabase;
use super::{Capabilities, ClaimRequest, FencingToken, StoreError, StoredResponse};
use crate::clock::millis;
use crate::fingerprint::Fingerprint;

/// One instant of a store's clocks, in milliseconds since the Unix epoch: the wall
/// clock, which TTLs are on, and the clock leases are on (the same for a database
/// server; a monotonic one for a store in this process, which a wall step cannot move).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreNow {
    /// The wall clock.
    pub wall_millis: i64,
    /// The lease clock.
    pub lease_millis: i64,
}

/// The record of one `(scope, key)`, as a [`RecordStore`] keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The fingerprint of the request that claimed it.
    pub fingerprint: Fingerprint,
    /// The token of the claim that holds it ([`FencingToken::RELEASED`] once a release
    /// kept it).
    pub token: FencingToken,
    /// Bumped by every change: what a compare-and-set compares.
    pub version: u64,
    /// When the claim that wrote it was made (wall clock).
    pub created_at: i64,
    /// When it stops being live unless a lease holds it (wall clock).
    pub expires_at: i64,
    /// In progress, or completed.
    pub body: RecordBody,
}

/// Where a [`Record`] is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordBody {
    /// Claimed: the lease's end (lease clock) and the steps recorded under it, encoded
    /// ([`encode_step`](super::encode_step)).
    InProgress {
        /// The lease's end, on the lease clock.
        lease_expires_at: i64,
        /// The recorded steps, concatenated.
        steps: Bytes,
    },
    /// The recorded response.
    Completed(StoredResponse),
}

/// A change a [`RecordStore`] applies to a record at its own now, bumping its version.
/// Durations are from that now: the store's clock places them.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Change<'a> {
    /// This claim takes the record over: in progress under the claim's fingerprint and
    /// token, created now, expiring its `ttl` from now, leased for its `lease` from now;
    /// the steps the record holds stay when `keep_steps`, else go, and so does a
    /// response. (A claim of a key without a record is [`RecordStore::insert`].)
    TakeOver {
        /// The claim (its scope and key are the record's).
        claim: &'a ClaimRequest<'a>,
        /// Keep the steps the record holds.
        keep_steps: bool,
    },
    /// The lease runs `lease` from now, and the record lives at least `ttl` from now.
    Renew {
        /// The new lease.
        lease: Duration,
        /// How long the record lives at least.
        ttl: Duration,
    },
    /// These bytes are appended to the steps.
    AppendStep(&'a [u8]),
    /// The record is completed with this response (its steps go).
    Complete(&'a StoredResponse),
    /// The lease ends now and the token becomes [`FencingToken::RELEASED`].
    EndLease,
}

/// What [`RecordStore::insert`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inserted {
    /// The key had no record; it has the new one now, at its first version.
    Inserted,
    /// The key has this record (nothing was written), read at this instant.
    Exists(Record, StoreNow),
    /// Nothing was written: the key had a record when the insert ran, deleted before the
    /// store could read it (a store whose insert and read are not one atomic step). The
    /// key may be free now; the protocol inserts again.
    Gone,
}

/// What [`RecordStore::update`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Updated {
    /// Applied; the record is at this version now.
    Updated(u64),
    /// Not applied: the record is not at the version given; it is this (`None`: gone),
    /// read at this instant.
    Stale(Option<Record>, StoreNow),
}

/// Storage of one [`Record`] per `(scope, key)`, changed only atomically. The protocol
/// over it is [`Fenced`](crate::fenced::Fenced)'s: wrap an implementation in
/// [`Fenced::new`](crate::fenced::Fenced::new) to get a [`Store`](super::Store).
///
/// Every method is one atomic operation at one instant of the store's clock, which its
/// answers carry where the protocol needs it.
#[async_trait]
pub trait RecordStore: Send + Sync + std::fmt::Debug + 'static {
    /// Inserts the record `claim` makes of its key ([`Record::claimed`]) unless the key
    /// has one; then answers that one and the store's now.
    async fn insert(&self, claim: &ClaimRequest<'_>) -> Result<Inserted, StoreError>;

    /// The key's record, if any, and the store's now.
    async fn read(&self, scope: &str, key: &str) -> Result<(Option<Record>, StoreNow), StoreError>;

    /// Applies `change` if the key's record is at `version` (bumping the version).
    async fn update(
        &self,
        scope: &str,
        key: &str,
        version: u64,
        change: &Change<'_>,
    ) -> Result<Updated, StoreError>;

    /// Deletes the key's record if it is at `version`; whether it did.
    async fn delete(&self, scope: &str, key: &str, version: u64) -> Result<bool, StoreError>;

    /// Deletes each `(scope, key, version)`'s record if it is at that version (distinct
    /// keys); how many it deleted: the sweeper's deletes of the records it judged
    /// expired. The default is one [`delete`](Self::delete) after another; a store over
    /// a network deletes them in one round trip.
    async fn delete_many(&self, records: &[(&str, &str, u64)]) -> Result<u64, StoreError> {
        let mut deleted = 0;
        for &(scope, key, version) in records {
            if self.delete(scope, key, version).await? {
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// Up to `limit` records whose `expires_at` is at or before now (wall clock), with
    /// their scope and key, and the store's now: the candidates the sweeper judges.
    async fn past_expiry(&self, limit: u32) -> Result<(Vec<KeyedRecord>, StoreNow), StoreError>;

    /// What the store offers beyond records (see [`Store::capabilities`](super::Store::capabilities)).
    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
    }
}

/// A record with its scope and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedRecord {
    /// The caller's scope.
    pub scope: String,
    /// The idempotency key.
    pub key: String,
    /// The record.
    pub record: Record,
}

impl Record {
    /// The version of a record a claim with `token` inserts: as random as the token, so
    /// that a record deleted and claimed anew never repeats a version an owner of the
    /// deleted one could still compare against.
    pub fn first_version(token: FencingToken) -> u64 {
        u64::from_ne_bytes(token.0.to_ne_bytes())
    }

    /// The record `claim` inserts for a key without one at `now`: what a
    /// [`RecordStore`] in this process writes, so that it inserts exactly as the seam
    /// defines it.
    pub fn claimed(claim: &ClaimRequest<'_>, now: StoreNow) -> Self {
        Self::fresh(claim, Self::first_version(claim.token), Bytes::new(), now)
    }

    /// An in-progress record of `claim` at `version`, holding `steps`.
    fn fresh(claim: &ClaimRequest<'_>, version: u64, steps: Bytes, now: StoreNow) -> Self {
        Self {
            fingerprint: *claim.fingerprint,
            token: claim.token,
            version,
            created_at: now.wall_millis,
            expires_at: now.wall_millis.saturating_add(millis(claim.ttl)),
            body: RecordBody::InProgress {
                lease_expires_at: now.lease_millis.saturating_add(millis(claim.lease)),
                steps,
            },
        }
    }

    /// The record `change` makes of this one at `now`, at the next version: what a
    /// [`RecordStore`] in this process writes, so that it applies changes exactly as the
    /// seam defines them.
    pub fn changed(&self, change: &Change<'_>, now: StoreNow) -> Self {
        let wall_after = |d: Duration| now.wall_millis.saturating_add(millis(d));
        let lease_after = |d: Duration| now.lease_millis.saturating_add(millis(d));
        let version = self.version.wrapping_add(1);
        if let Change::TakeOver { claim, keep_steps } = *change {
            let steps = match &self.body {
                RecordBody::InProgress { steps, .. } if keep_steps => steps.clone(),
                _ => Bytes::new(),
            };
            return Self::fresh(claim, version, steps, now);
        }
        let mut record = self.clone();
        record.version = version;
        match (*change, &mut record.body) {
            (
                Change::Renew { lease, ttl },
                RecordBody::InProgress {
                    lease_expires_at, ..
                },
            ) => {
                *lease_expires_at = lease_after(lease);
                record.expires_at = record.expires_at.max(wall_after(ttl));
            }
            (Change::AppendStep(step), RecordBody::InProgress { steps, .. }) => {
                let mut appended = Vec::with_capacity(steps.len() + step.len());
                appended.extend_from_slice(steps);
                appended.extend_from_slice(step);
                *steps = Bytes::from(appended);
            }
            (Change::Complete(response), _) => {
                record.body = RecordBody::Completed(response.clone());
            }
            (
                Change::EndLease,
                RecordBody::InProgress {
                    lease_expires_at, ..
                },
            ) => {
                *lease_expires_at = now.lease_millis;
                record.token = FencingToken::RELEASED;
            }
            // A change of an in-progress record applied to a completed one changes
            // nothing but the version (the protocol never sends one).
            _ => {}
        }
        record
    }
}

#[cfg(feature = "sql")]
/// A [`RecordStore`] whose records live in database `DB`, which can read and change them
/// on a connection of a transaction it began: what
/// [`Fenced::transactions`](crate::fenced::Fenced::transactions) needs.
#[async_trait]
pub trait TxRecords<DB: TxDatabase>: RecordStore {
    /// Begins a handler's transaction (see [`TxStore::begin`](super::TxStore::begin)).
    async fn begin(&self) -> Result<sqlx::Transaction<'static, DB>, StoreError>;

    /// [`RecordStore::read`] on `conn`.
    async fn read_in(
        &self,
        conn: &mut DB::Connection,
        scope: &str,
        key: &str,
    ) -> Result<(Option<Record>, StoreNow), StoreError>;

    /// [`RecordStore::update`] on `conn`: committed or rolled back with its transaction.
    async fn update_in(
        &self,
        conn: &mut DB::Connection,
        scope: &str,
        key: &str,
        version: u64,
        change: &Change<'_>,
    ) -> Result<Updated, StoreError>;

    /// [`TxStore::concurrency`](super::TxStore::concurrency); unbounded by default.
    fn concurrency(&self) -> Option<std::sync::Arc<tokio::sync::Semaphore>> {
        None
    }

    /// [`TxStore::max_hold`](super::TxStore::max_hold); unbounded by default.
    fn max_hold(&self) -> Option<Duration> {
        None
    }
}
