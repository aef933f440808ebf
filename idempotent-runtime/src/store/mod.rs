//! Where claims and recorded responses live.
//!
//! A [`Store`] keeps one record per `(scope, key)`. Every state change is one atomic
//! operation on that record, fenced by the [`FencingToken`] its claim received:
//!
//! ```text
//! claim ──▶ in_progress(token) ──complete(token)──▶ completed ──(ttl)──▶ purged
//!               │   ▲ renew(token), record_step(token)
//!               └───┴─release(token)──▶ gone (the next request claims anew), or, when
//!                                       it holds steps, kept with its lease ended
//! ```
//!
//! A record also keeps the [steps](RecordedStep) its handler completed (recovery points,
//! see [`RecordedStep`]; the protocol's rules for them are [`crate::fenced::rules`]).
//!
//! Operators look at and delete single records with [`Store::inspect`] and
//! [`Store::forget`] (or the engine's `Idempotency::inspect` / `Idempotency::forget`).
//!
//! What a store offers beyond these operations (its clock, in-process records,
//! transactions, change notifications) is one value, its [`Capabilities`]. A decorator
//! implements [`Forward`] and overrides only what it changes.
//!
//! Implementations: [`MemoryStore`] (one process, tests and demos), `SqliteStore` (one
//! host, the embedded default), `PostgresStore` and `MySqlStore` (many instances, one
//! shared database), `RedisStore` (many instances on Redis/Valkey; weaker durability, see
//! its module docs). All pass one conformance suite.
//!
//! Each of them is a [`RecordStore`] (the fenced record seam: records kept and changed by
//! compare-and-set, no rule decided) behind [`Fenced`](crate::fenced::Fenced), the
//! protocol that makes it a [`Store`].

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::fingerprint::Fingerprint;

mod capabilities;
mod forward;
mod memory;
mod memory_usage;
#[cfg(feature = "mysql")]
mod mysql;
mod operator;
#[cfg(feature = "postgres")]
mod postgres;
mod record;
mod record_store;
#[cfg(any(feature = "sql", feature = "redis"))]
mod redact;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sql")]
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;
mod steps;
mod tx_support;

pub use capabilities::{Capabilities, ClaimWatch, WatchClaims};
pub use forward::Forward;
pub use memory::{MemoryRecords, MemoryStore};
pub use memory_usage::MemoryUsage;
#[cfg(feature = "mysql")]
pub use mysql::MySqlStore;
pub use operator::{ForgetOutcome, RecordInfo, RecordState};
pub(crate) use operator::{lease_left_from_millis, system_time_from_millis};
#[cfg(feature = "postgres")]
pub use postgres::PostgresStore;
pub(crate) use record::CompactResponse;
pub use record::{decode_headers, encode_headers};
#[cfg(feature = "sql")]
pub use record_store::TxRecords;
pub use record_store::{
    Change, Inserted, KeyedRecord, Record, RecordBody, RecordStore, StoreNow, Updated,
};
#[cfg(any(feature = "sql", feature = "redis"))]
pub use redact::redacted_url;
#[cfg(feature = "redis")]
pub use redis::{RedisConnection, RedisRecords, RedisStore, RedisStoreBuilder};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
#[cfg(feature = "sqlite")]
#[doc(hidden)]
pub use sqlite::{GroupCommitStats, WriteKind};
pub use steps::{MAX_STEP_NAME, RecordedStep, decode_steps, encode_step, unsettled_intents};
pub use tx_support::TxSupport;
#[cfg(feature = "sql")]
pub use tx_support::{TxDatabase, TxStore};

/// The token a claim receives. `complete`, `release` and `renew` only act while the
/// record still carries this token, so an owner whose lease was taken over can neither
/// overwrite the new owner's result nor delete its claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FencingToken(pub i64);

impl FencingToken {
    /// The token a released record that keeps its steps holds
    /// ([`rules::release`](crate::fenced::rules::release)): no claim ever carries it, so the released owner is
    /// fenced off like any other, and only a takeover acts on the record.
    pub const RELEASED: Self = Self(0);

    /// A fresh random token; never [`RELEASED`](Self::RELEASED).
    pub fn random() -> Self {
        loop {
            let token = Self(rand::random());
            if token != Self::RELEASED {
                return token;
            }
        }
    }
}

/// One claim attempt: who, which key, what request, for how long.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The authenticated caller's scope; keys never collide across scopes.
    pub scope: &'a str,
    /// The idempotency key (unquoted header value).
    pub key: &'a str,
    /// The request's fingerprint.
    pub fingerprint: &'a Fingerprint,
    /// How long the record lives after this claim.
    pub ttl: Duration,
    /// How long the claim stays owned without a heartbeat.
    pub lease: Duration,
    /// The token this claim will carry if it wins.
    pub token: FencingToken,
}

/// What a claim attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// The caller owns the key now (new key, expired record, or a lease that ran out);
    /// run the handler and `complete` or `release` with this token.
    Claimed {
        /// The token the claim carries.
        token: FencingToken,
        /// `None` for a key with no live record (new, released or purged); otherwise why
        /// the earlier record could be taken over.
        takeover: Option<Takeover>,
        /// The steps the earlier execution of this request completed, in the order they
        /// were recorded, read in the claim's own atomic operation: non-empty only for a
        /// [`Takeover::LeaseLost`] of a record that holds steps
        /// ([`steps_survive`](crate::fenced::rules::steps_survive)).
        steps: Vec<RecordedStep>,
    },
    /// Completed earlier with the same fingerprint: answer with this.
    Replay(StoredResponse),
    /// Another request with the same fingerprint holds a live lease.
    InProgress {
        /// Until the holder's lease runs out (at least one second when reported).
        retry_after: Duration,
    },
    /// The key was used for a request with another fingerprint.
    Mismatch,
}

/// Why a claim took over an earlier record of the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Takeover {
    /// The record's TTL ran out (and, if it was still in progress, its lease too): the
    /// key counts as new, whatever the earlier request's fingerprint.
    Expired,
    /// The record was still within its TTL, but the claim holding it stopped renewing its
    /// lease (its owner crashed or stalled): a retry with the same fingerprint takes over.
    LeaseLost,
}

impl Takeover {
    /// A stable lower-case name for logs and metrics: `expired`, `lease_lost`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::LeaseLost => "lease_lost",
        }
    }
}

impl std::fmt::Display for Takeover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A response as recorded for replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u16,
    /// Replayable headers in order: lower-case name and raw value.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body; `None` when it was larger than the engine's stored-response cap (the
    /// status and headers are still replayed, the body is replaced by a problem
    /// document saying so).
    pub body: Option<Bytes>,
}

/// A store could not be reached or answered with an error. Requests get `503`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database driver failed.
    #[cfg(feature = "sql")]
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Applying the embedded migrations failed.
    #[cfg(feature = "sql")]
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// Redis failed: unreachable, a timeout, an error reply.
    #[cfg(feature = "redis")]
    #[error("redis error: {0}")]
    Redis(#[from] ::redis::RedisError),
    /// Opening the store failed; the message names what was opened (passwords redacted).
    #[error("cannot open idempotency store at {location}: {reason}")]
    Open {
        /// What was opened: a path or a URL with its password redacted.
        location: String,
        /// Why it failed.
        reason: String,
    },
    /// The store did not answer within the engine's store timeout.
    #[error("the idempotency store did not answer within {0:?}")]
    Timeout(Duration),
    /// A stored record could not be decoded.
    #[error("corrupt idempotency record: {0}")]
    Corrupt(String),
    /// A store's own failure that none of the variants above describes: what a store
    /// outside this crate (another database, a cache, a remote service) reports.
    #[error("idempotency store error: {0}")]
    Backend(Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl StoreError {
    /// Wraps a store's own error as [`StoreError::Backend`].
    pub fn backend(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Self::Backend(error.into())
    }
}

/// Durable storage of claims and responses. Object safe; the engine holds an
/// `Arc<dyn Store>`.
///
/// The required methods are exactly the operations the engine calls; what a store may
/// offer beyond them is one value, [`capabilities`](Self::capabilities). A decorator
/// (metrics, tracing, faults) implements [`Forward`] instead, which forwards every
/// operation and capability it does not override.
///
/// Every method is one atomic operation. In particular `claim` decides and writes in
/// one step: a check followed by an insert would let two duplicates both run.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// Claims `(scope, key)` atomically. Takes over a record whose TTL expired, or an
    /// in-progress record whose lease ran out *and* whose fingerprint matches. The
    /// answer carries, for a replay, how long the record lives on
    /// ([`ClaimAnswer::replay_lives_for`]).
    async fn claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimAnswer, StoreError>;

    /// Extends the lease of an in-progress claim to `lease` from now, and its expiry to
    /// at least `ttl` from now (never earlier than it was): the record lives a whole TTL
    /// past its owner's last sign of life, so a handler that outlives its TTL and then
    /// crashes leaves a record that the retry of its request resumes (see
    /// [`RecordedStep`]). `Ok(false)`: the token no longer owns the record (taken over,
    /// or released).
    async fn renew(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        lease: Duration,
        ttl: Duration,
    ) -> Result<bool, StoreError>;

    /// Records the response and marks the claim completed. `Ok(false)`: the token no
    /// longer owns the record, nothing was written.
    async fn complete(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError>;

    /// Appends `step` to the steps of the in-progress claim the token owns (see
    /// [`encode_step`]), in one atomic operation. `Ok(false)`: the token no longer owns
    /// the record, nothing was written. The engine records a name at most once under one
    /// record lifetime, or twice for an at-most-once step (its intent, then its output:
    /// see [`RecordedStep`]); a store need not check it, and keeps every entry.
    async fn record_step(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        step: &RecordedStep,
    ) -> Result<bool, StoreError>;

    /// Gives up the in-progress claim the token owns: deletes it, or, when it holds
    /// steps ([`rules::release`](crate::fenced::rules::release)), keeps it in progress with its lease ended now and
    /// its token set to [`FencingToken::RELEASED`] (the released owner is fenced off as
    /// after a delete), so that the next claim of the same request takes it over and
    /// resumes. `Ok(false)`: it owned nothing.
    async fn release(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError>;

    /// Deletes up to `limit` records whose TTL ran out; returns how many.
    async fn purge_expired(&self, limit: u32) -> Result<u64, StoreError>;

    /// Operator tool: the live record of `(scope, key)`, or `None` when there is none.
    ///
    /// One atomic read judged at one instant of the store's own clock (the one its claims
    /// use). A record is live exactly when a claim would not take it over as
    /// [`Takeover::Expired`]: within its TTL, or in progress with a lease not run out. An
    /// expired record is `None` even if it is still stored. For an in-progress record,
    /// [`RecordState::InProgress`]'s `holder_alive` says whether its lease is still held
    /// (`now < lease_expires_at`). Times are converted to [`SystemTime`](std::time::SystemTime)
    /// from whatever the store keeps.
    ///
    /// A store outside this crate must implement it with the same meaning (the
    /// conformance suite checks it).
    async fn inspect(&self, scope: &str, key: &str) -> Result<Option<RecordInfo>, StoreError>;

    /// Operator tool: deletes the record of `(scope, key)` so the next request with that
    /// key runs as new (e.g. to unblock a key whose stored response is wrong, or whose
    /// holder is known to be dead).
    ///
    /// One atomic operation at one instant of the store's own clock:
    ///
    /// - completed, or in progress with a lease that ran out: deleted,
    ///   [`ForgetOutcome::Forgotten`] with the record as it was;
    /// - in progress with a live lease: [`ForgetOutcome::Refused`] with the lease time
    ///   left, nothing changed — unless `force`, which deletes it too (`Forgotten`);
    /// - no live record: [`ForgetOutcome::NotFound`] (an expired record still stored is
    ///   deleted as well).
    ///
    /// Fencing is unchanged: once its record is forgotten, a claim's token owns nothing,
    /// so its `renew`, `complete` and `release` return `false`, also after another claim
    /// of the key. A store outside this crate must implement it with the same meaning
    /// (the conformance suite checks it).
    async fn forget(
        &self,
        scope: &str,
        key: &str,
        force: bool,
    ) -> Result<ForgetOutcome, StoreError>;

    /// What this store offers beyond the operations above (clock, in-process records,
    /// transactions, change notifications); [`Capabilities::none`] by default. The engine
    /// reads it once, when it is built; the conformance suite checks that it is
    /// consistent (e.g. an in-process store gives the clock its records expire by).
    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
    }
}

/// What [`Store::claim`] answers: the outcome, and how long a replayed record lives on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimAnswer {
    /// What the claim found.
    pub outcome: ClaimOutcome,
    /// For a [`ClaimOutcome::Replay`]: how long the record lives on at least, measured
    /// from a moment no earlier than the call (by the store's clock, from the statement
    /// that read it); what the engine's replay cache bounds a copy of the record by.
    /// `None` for every other outcome, and for a replay when the store cannot tell (its
    /// replays are then not cached).
    pub replay_lives_for: Option<Duration>,
}

impl From<ClaimOutcome> for ClaimAnswer {
    /// An answer without a remaining life: what a store that cannot tell one answers.
    fn from(outcome: ClaimOutcome) -> Self {
        Self {
            outcome,
            replay_lives_for: None,
        }
    }
}

/// Whole seconds to tell a client in `Retry-After`: rounded up, at least one.
pub(crate) fn retry_after_from_millis(millis: i64) -> Duration {
    let millis = u64::try_from(millis.max(0)).unwrap_or(0);
    Duration::from_secs(millis.div_ceil(1000).max(1))
}
