//! [`SqliteStore`]: records in an SQLite database file — **the single-host embedded
//! default**.
//!
//! One file on local disk, shared by every process of the app *on that host* (WAL mode
//! lets readers and the one writer proceed together; a busy timeout makes writers queue
//! instead of failing). It survives restarts. It does **not** coordinate several hosts:
//! two machines each with their own file each run a retried request once — use
//! `PostgresStore` when the app runs on more than one machine. Never put the file on a
//! network file system; SQLite's locking is not reliable there.
//!
//! - The schema (DESIGN.md §4, `migrations/sqlite/`) is embedded in the binary and applied
//!   on open, recorded in its own [`SqliteStore::MIGRATIONS_TABLE`] so it never collides
//!   with an app's own `sqlx` migrations in the same database.
//! - Times are INTEGER milliseconds from the store's [`Clock`] (the system clock unless
//!   one is injected), never SQLite's `now`, so every decision of one store uses one
//!   clock.
//! - Every operation is a single statement. The claim is one
//!   `INSERT … ON CONFLICT DO UPDATE … WHERE <may take over> RETURNING`: inserting a new
//!   key, taking over an expired record, or taking over a same-fingerprint claim whose
//!   lease ran out happen atomically, or not at all.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use sqlx::migrate::{MigrateError, Migration, MigrationType, Migrator};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Row, SqlSafeStr};

use super::{
    ClaimOutcome, ClaimRequest, FencingToken, Store, StoreError, StoredResponse, decode_headers,
    encode_headers, retry_after_from_millis,
};
use crate::clock::{Clock, SystemClock, millis};
use crate::fingerprint::Fingerprint;

/// The embedded migrations, in order. The files live in `migrations/sqlite/`; the
/// version is the number before the first `_`, as `sqlx migrate` names them.
const MIGRATIONS: &[(i64, &str, &str)] = &[(
    1,
    "create idempotency records",
    include_str!("../../migrations/sqlite/0001_create_idempotency_records.sql"),
)];

/// How often opening tries to apply the migrations. Two processes (or pools) opening one
/// fresh file at the same moment both try; the loser fails (its bookkeeping insert is a
/// duplicate, or its transaction is busy) and its next attempt finds nothing to do.
const MIGRATION_ATTEMPTS: u32 = 10;

/// How often opening retries a first connection refused as busy (see
/// [`SqliteStore::open_with_clock`]).
const OPEN_ATTEMPTS: u32 = 10;

/// How often a claim is retried when the record changed between the atomic claim and
/// the read that classifies a refusal (released or purged meanwhile).
const CLAIM_ATTEMPTS: usize = 8;

const CLAIM: &str = "\
INSERT INTO idempotency_records
    (scope, key, fingerprint, fingerprint_version, state, token, lease_expires_at,
     status, headers, body, created_at, expires_at)
VALUES (?1, ?2, ?3, ?4, 'in_progress', ?5, ?6, NULL, NULL, NULL, ?7, ?8)
ON CONFLICT (scope, key) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    fingerprint_version = excluded.fingerprint_version,
    state = 'in_progress',
    token = excluded.token,
    lease_expires_at = excluded.lease_expires_at,
    status = NULL,
    headers = NULL,
    body = NULL,
    created_at = excluded.created_at,
    expires_at = excluded.expires_at
WHERE (idempotency_records.expires_at <= excluded.created_at
       AND (idempotency_records.state = 'completed'
            OR idempotency_records.lease_expires_at <= excluded.created_at))
   OR (idempotency_records.state = 'in_progress'
       AND idempotency_records.lease_expires_at <= excluded.created_at
       AND idempotency_records.fingerprint = excluded.fingerprint
       AND idempotency_records.fingerprint_version = excluded.fingerprint_version)
RETURNING token";

const READ: &str = "\
SELECT state, fingerprint, fingerprint_version, lease_expires_at, status, headers, body,
       expires_at
FROM idempotency_records
WHERE scope = ?1 AND key = ?2";

const RENEW: &str = "\
UPDATE idempotency_records
SET lease_expires_at = ?4, expires_at = MAX(expires_at, ?4)
WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = 'in_progress'";

const COMPLETE: &str = "\
UPDATE idempotency_records
SET state = 'completed', lease_expires_at = NULL, status = ?4, headers = ?5, body = ?6
WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = 'in_progress'";

const RELEASE: &str = "\
DELETE FROM idempotency_records
WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = 'in_progress'";

const PURGE: &str = "\
DELETE FROM idempotency_records
WHERE rowid IN (
    SELECT rowid FROM idempotency_records
    WHERE expires_at <= ?1 AND (state = 'completed' OR lease_expires_at <= ?1)
    LIMIT ?2
)";

/// A [`Store`] in an SQLite database file: the single-host embedded default (see the
/// module docs).
///
/// Cheap to clone; clones share the pool.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    clock: Arc<dyn Clock>,
}

impl SqliteStore {
    /// Connections in the pool [`open`](Self::open) creates.
    pub const DEFAULT_MAX_CONNECTIONS: u32 = 8;

    /// How long a statement waits for another connection's write lock before failing.
    pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

    /// The table that records which of the embedded migrations were applied. Not sqlx's
    /// default `_sqlx_migrations`: an app sharing the database may run its own
    /// migrations, and a migrator refuses a table holding versions it does not know.
    pub const MIGRATIONS_TABLE: &str = "_idempotent_sqlite_migrations";

    /// Opens (creating it if missing) the database at `url_or_path` — a file path or a
    /// `sqlite:` URL such as `sqlite://payments.db` — on the system clock, with the
    /// [recommended options](Self::connect_options) and a pool of
    /// [`DEFAULT_MAX_CONNECTIONS`](Self::DEFAULT_MAX_CONNECTIONS), and applies the
    /// embedded migrations.
    ///
    /// The parent directory must exist. An in-memory URL (`sqlite::memory:`) works but
    /// forgets everything once the pool's connections close; prefer
    /// [`MemoryStore`](crate::store::MemoryStore) for that.
    ///
    /// # Errors
    ///
    /// [`StoreError::Open`] naming `url_or_path` when the file cannot be opened or
    /// created (missing directory, no permission, not a database) or the schema cannot
    /// be applied.
    pub async fn open(url_or_path: &str) -> Result<Self, StoreError> {
        Self::open_with_clock(url_or_path, Arc::new(SystemClock)).await
    }

    /// Like [`open`](Self::open), with every expiry and lease decision taken on
    /// `clock` (tests pass a [`ManualClock`](crate::clock::ManualClock)).
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open).
    pub async fn open_with_clock(
        url_or_path: &str,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        let options = Self::connect_options(url_or_path)?;
        // Processes opening one fresh file together race to switch it to WAL; the loser's
        // first connection is refused as busy at once (no busy handler applies), so it
        // waits a moment and tries again.
        let mut attempt = 1;
        let pool = loop {
            let connected = SqlitePoolOptions::new()
                .max_connections(Self::DEFAULT_MAX_CONNECTIONS)
                .connect_with(options.clone())
                .await;
            match connected {
                Ok(pool) => break pool,
                Err(e) if is_busy(&e) && attempt < OPEN_ATTEMPTS => {
                    tokio::time::sleep(Duration::from_millis(25 * u64::from(attempt))).await;
                    attempt += 1;
                }
                Err(e) => return Err(open_error(url_or_path, e)),
            }
        };
        migrate(&pool)
            .await
            .map_err(|e| open_error(url_or_path, e))?;
        Ok(Self { pool, clock })
    }

    /// The connect options [`open`](Self::open) uses for `url_or_path` (a file path or a
    /// `sqlite:` URL): create the file if missing, WAL journal, `synchronous = NORMAL`
    /// (durable across application crashes; the last transactions may be lost on power
    /// failure) and a [`DEFAULT_BUSY_TIMEOUT`](Self::DEFAULT_BUSY_TIMEOUT). Build your
    /// own pool from them to share it between the store ([`from_pool`](Self::from_pool))
    /// and the rest of the app.
    ///
    /// # Errors
    ///
    /// [`StoreError::Open`] when `url_or_path` is a malformed `sqlite:` URL.
    pub fn connect_options(url_or_path: &str) -> Result<SqliteConnectOptions, StoreError> {
        let options = if url_or_path.starts_with("sqlite:") {
            SqliteConnectOptions::from_str(url_or_path).map_err(|e| open_error(url_or_path, e))?
        } else {
            // A plain path is taken literally: no URL decoding of `%` or `?`.
            SqliteConnectOptions::new().filename(Path::new(url_or_path))
        };
        Ok(options
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Self::DEFAULT_BUSY_TIMEOUT))
    }

    /// A store on a pool the app already has (so the store and the app share
    /// connections), on `clock`; applies the embedded migrations.
    ///
    /// The pool's options are the caller's: give its connections a busy timeout (sqlx's
    /// default is 5s) and preferably WAL mode — [`connect_options`](Self::connect_options)
    /// has both.
    ///
    /// # Errors
    ///
    /// [`StoreError::Migrate`] when the schema cannot be applied.
    pub async fn from_pool(pool: SqlitePool, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        migrate(&pool).await?;
        Ok(Self { pool, clock })
    }

    /// The connection pool, to share with the rest of the app.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The embedded migrations as a [`Migrator`] recording into
    /// [`MIGRATIONS_TABLE`](Self::MIGRATIONS_TABLE);
    /// [`open`](Self::open) and [`from_pool`](Self::from_pool) run it.
    pub fn migrator() -> Migrator {
        let migrations = MIGRATIONS
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(
                    version,
                    description.into(),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    false,
                )
            })
            .collect();
        let mut migrator = Migrator::with_migrations(migrations);
        migrator.dangerous_set_table_name(Self::MIGRATIONS_TABLE);
        migrator
    }

    async fn read(
        &self,
        claim: &ClaimRequest<'_>,
        now: i64,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let Some(row) = sqlx::query(READ)
            .bind(claim.scope)
            .bind(claim.key)
            .fetch_optional(&self.pool)
            .await?
        else {
            return Ok(None);
        };
        classify(&row, claim.fingerprint, now)
    }
}

/// What a live record that refused a claim means for it; `None` when the record no
/// longer looks like one that refuses (it changed after the claim statement).
fn classify(
    row: &SqliteRow,
    fingerprint: &Fingerprint,
    now: i64,
) -> Result<Option<ClaimOutcome>, StoreError> {
    let expires_at: i64 = row.try_get("expires_at")?;
    let state: String = row.try_get("state")?;
    let lease_expires_at: Option<i64> = row.try_get("lease_expires_at")?;
    // A claim whose lease is live is never expired, whatever its TTL says.
    let running = state == "in_progress" && lease_expires_at.is_some_and(|lease| lease > now);
    if expires_at <= now && !running {
        return Ok(None);
    }
    let digest: Vec<u8> = row.try_get("fingerprint")?;
    let version: i64 = row.try_get("fingerprint_version")?;
    if digest != fingerprint.digest || version != i64::from(fingerprint.version) {
        return Ok(Some(ClaimOutcome::Mismatch));
    }
    match state.as_str() {
        "completed" => {
            let status: Option<i64> = row.try_get("status")?;
            let status = status
                .and_then(|s| u16::try_from(s).ok())
                .ok_or_else(|| StoreError::Corrupt(format!("bad status {status:?}")))?;
            let headers: Option<Vec<u8>> = row.try_get("headers")?;
            let headers = decode_headers(
                headers
                    .as_deref()
                    .ok_or_else(|| StoreError::Corrupt("completed without headers".into()))?,
            )?;
            let body: Option<Vec<u8>> = row.try_get("body")?;
            Ok(Some(ClaimOutcome::Replay(StoredResponse {
                status,
                headers,
                body: body.map(Bytes::from),
            })))
        }
        "in_progress" => {
            let lease_expires_at = lease_expires_at
                .ok_or_else(|| StoreError::Corrupt("in progress without a lease".into()))?;
            if lease_expires_at > now {
                Ok(Some(ClaimOutcome::InProgress {
                    retry_after: retry_after_from_millis(lease_expires_at - now),
                }))
            } else {
                Ok(None)
            }
        }
        other => Err(StoreError::Corrupt(format!("unknown state {other:?}"))),
    }
}

/// SQLITE_BUSY or SQLITE_LOCKED, with any extended code.
fn is_busy(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = error else {
        return false;
    };
    db.code()
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| matches!(code & 0xff, 5 | 6))
}

async fn migrate(pool: &SqlitePool) -> Result<(), MigrateError> {
    let migrator = SqliteStore::migrator();
    let mut attempt = 1;
    loop {
        match migrator.run(pool).await {
            Ok(()) => return Ok(()),
            // Two processes opening one fresh file race to apply the schema; the loser's
            // transaction is refused as busy (or its bookkeeping insert as a duplicate).
            // The next attempt sees the winner's work and has nothing left to do.
            Err(MigrateError::Execute(_) | MigrateError::ExecuteMigration(..))
                if attempt < MIGRATION_ATTEMPTS =>
            {
                tokio::time::sleep(Duration::from_millis(25 * u64::from(attempt))).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

fn open_error(location: &str, reason: impl std::fmt::Display) -> StoreError {
    StoreError::Open {
        location: location.to_owned(),
        reason: reason.to_string(),
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn sql_pool(&self) -> Option<super::SqlPool> {
        Some(super::SqlPool::Sqlite(self.pool.clone()))
    }

    async fn try_claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        for _ in 0..CLAIM_ATTEMPTS {
            let now = self.clock.now_millis();
            let claimed = sqlx::query(CLAIM)
                .bind(claim.scope)
                .bind(claim.key)
                .bind(&claim.fingerprint.digest[..])
                .bind(i64::from(claim.fingerprint.version))
                .bind(claim.token.0)
                .bind(now.saturating_add(millis(claim.lease)))
                .bind(now)
                .bind(now.saturating_add(millis(claim.ttl)))
                .fetch_optional(&self.pool)
                .await?;
            if let Some(row) = claimed {
                let token: i64 = row.try_get("token")?;
                return Ok(ClaimOutcome::Claimed {
                    token: FencingToken(token),
                });
            }
            // The claim statement decided atomically not to take the record over; this
            // read only says why. If the record changed in between (released, purged,
            // completed, taken over), claim again.
            if let Some(outcome) = self.read(claim, now).await? {
                return Ok(outcome);
            }
        }
        Ok(super::contended(claim, CLAIM_ATTEMPTS))
    }

    async fn renew(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let lease_expires_at = self.clock.now_millis().saturating_add(millis(lease));
        let done = sqlx::query(RENEW)
            .bind(scope)
            .bind(key)
            .bind(token.0)
            .bind(lease_expires_at)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn complete(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        complete_on(&self.pool, scope, key, token, response).await
    }

    async fn release(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(RELEASE)
            .bind(scope)
            .bind(key)
            .bind(token.0)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn purge_expired(&self, limit: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(PURGE)
            .bind(self.clock.now_millis())
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}

/// The fenced completion on any SQLite executor: the pool, or the connection of a
/// transactional handler's transaction.
async fn complete_on<'e>(
    executor: impl sqlx::SqliteExecutor<'e>,
    scope: &str,
    key: &str,
    token: FencingToken,
    response: &StoredResponse,
) -> Result<bool, StoreError> {
    let done = sqlx::query(COMPLETE)
        .bind(scope)
        .bind(key)
        .bind(token.0)
        .bind(i64::from(response.status))
        .bind(encode_headers(&response.headers))
        .bind(response.body.as_deref())
        .execute(executor)
        .await?;
    Ok(done.rows_affected() > 0)
}

#[async_trait]
impl crate::transaction::TxDatabase for sqlx::Sqlite {
    const DATABASE_NAME: &'static str = "SQLite";

    fn pool_of(store: &dyn Store) -> Option<sqlx::Pool<Self>> {
        match store.sql_pool()? {
            super::SqlPool::Sqlite(pool) => Some(pool),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// `BEGIN IMMEDIATE`: the transaction takes the write lock at once (waiting up to the
    /// busy timeout for it). A deferred transaction that reads first holds a WAL snapshot,
    /// and its first write fails with `SQLITE_BUSY_SNAPSHOT` — without waiting — if any
    /// other connection (another request, this request's own heartbeat) committed since.
    async fn begin(
        pool: &sqlx::Pool<Self>,
    ) -> Result<sqlx::Transaction<'static, Self>, sqlx::Error> {
        pool.begin_with("BEGIN IMMEDIATE").await
    }

    async fn complete_in(
        conn: &mut sqlx::SqliteConnection,
        _store: &dyn Store,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        complete_on(conn, scope, key, token, response).await
    }
}
