//! Where claims and recorded responses live.
//!
//! A [`Store`] keeps one record per `(scope, key)`. Every state change is one atomic
//! operation on that record, fenced by the [`FencingToken`] its claim received:
//!
//! ```text
//! try_claim ──▶ in_progress(token) ──complete(token)──▶ completed ──(ttl)──▶ purged
//!                   │   ▲ renew(token)
//!                   └───┴─release(token)──▶ (gone: the next request claims anew)
//! ```
//!
//! Implementations: [`MemoryStore`] (one process, tests and demos), `SqliteStore` (one
//! host, the embedded default), `PostgresStore` (many instances), `RedisStore` (many
//! instances on Redis/Valkey; weaker durability, see its module docs). All pass one
//! conformance suite.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::fingerprint::Fingerprint;

mod memory;
#[cfg(feature = "postgres")]
mod postgres;
mod record;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresPool, PostgresStore};
pub use record::{decode_headers, encode_headers};
#[cfg(feature = "redis")]
pub use redis::{RedisStore, RedisStoreBuilder};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;

/// The token a claim receives. `complete`, `release` and `renew` only act while the
/// record still carries this token, so an owner whose lease was taken over can neither
/// overwrite the new owner's result nor delete its claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FencingToken(pub i64);

impl FencingToken {
    /// A fresh random token.
    pub fn random() -> Self {
        Self(rand::random())
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
pub enum ClaimOutcome {
    /// The caller owns the key now (new key, expired record, or a lease that ran out);
    /// run the handler and `complete` or `release` with this token.
    Claimed {
        /// The token the claim carries.
        token: FencingToken,
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
pub enum StoreError {
    /// The database driver failed.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Applying the embedded migrations failed.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
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
}

/// Durable storage of claims and responses. Object safe; the engine holds an
/// `Arc<dyn Store>`.
///
/// Every method is one atomic operation. In particular `try_claim` decides and writes in
/// one step: a check followed by an insert would let two duplicates both run.
#[async_trait]
pub trait Store: std::any::Any + Send + Sync + std::fmt::Debug {
    /// Claims `(scope, key)` atomically. Takes over a record whose TTL expired, or an
    /// in-progress record whose lease ran out *and* whose fingerprint matches.
    async fn try_claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError>;

    /// Extends the lease of an in-progress claim, and its expiry to at least the new
    /// lease's end (a handler that outlives its TTL keeps its record). `Ok(false)`: the
    /// token no longer owns the record (taken over, or released).
    async fn renew(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        lease: Duration,
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

    /// Deletes the in-progress claim the token owns. `Ok(false)`: it owned nothing.
    async fn release(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError>;

    /// Deletes up to `limit` records whose TTL ran out; returns how many.
    async fn purge_expired(&self, limit: u32) -> Result<u64, StoreError>;

    /// The SQL pool behind the store, for transactional handlers; `None` (the default)
    /// for stores that are not SQL databases.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    fn sql_pool(&self) -> Option<SqlPool> {
        None
    }
}

/// The pool of an SQL store, with what a transactional handler's completion needs to know
/// about where the store keeps its records, so handlers can write to the same database.
///
/// The engine uses nothing but this value: a decorator store (metrics, tracing, …) that
/// forwards [`Store::sql_pool`] of the store it wraps supports transactional handlers
/// exactly like that store.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum SqlPool {
    /// An SQLite pool (the records live in its `idempotency_records` table).
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
    /// A Postgres pool and the table (possibly in a schema) of the store that made it.
    #[cfg(feature = "postgres")]
    Postgres(PostgresPool),
}

/// A store's answer when the record kept changing under every claim attempt: someone
/// else is busy with the key, which is what `409 request_in_progress` says. Nothing ran.
pub(crate) fn contended(claim: &ClaimRequest<'_>, attempts: usize) -> ClaimOutcome {
    tracing::warn!(
        scope = claim.scope,
        key = claim.key,
        attempts,
        "idempotency record kept changing during claim; answering in progress"
    );
    ClaimOutcome::InProgress {
        retry_after: Duration::from_secs(1),
    }
}

/// Whole seconds to tell a client in `Retry-After`: rounded up, at least one.
pub(crate) fn retry_after_from_millis(millis: i64) -> Duration {
    let millis = u64::try_from(millis.max(0)).unwrap_or(0);
    Duration::from_secs(millis.div_ceil(1000).max(1))
}
