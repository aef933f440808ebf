//! [`PostgresStore`]: the store for many instances sharing one PostgreSQL database.
//!
//! This is how the system scales past one machine: every instance of the app talks to the
//! same `idempotency_records` table, so a retry that lands on another instance still finds
//! the first attempt's claim or recorded response.
//!
//! # One clock: the database's
//!
//! Instances' clocks drift. Every expiry and lease decision, and every timestamp written,
//! therefore uses the database's clock, never the app's: TTL and lease travel to the
//! server as `interval` parameters and the server computes `now() + interval`.
//!
//! Which database clock: `now()` is the start of the statement's transaction. Each
//! operation is one autocommit statement, so that is the current time, and it is the
//! *same* value everywhere inside the statement: the claim's take-over decision, the
//! timestamps it writes and the classification of the record it found all agree. The one
//! exception is the `Retry-After` of an in-progress duplicate, computed from
//! `clock_timestamp()` (the real time when the row is read): a claim whose statement began
//! a moment before the holder's (and then found the holder's committed row) would
//! otherwise see more than a full lease left.
//!
//! # One statement per operation
//!
//! - `try_claim` is a single statement: an `INSERT … ON CONFLICT (scope, key) DO UPDATE
//!   … WHERE <expired, or lease ran out with the same fingerprint>` inside a CTE, plus a
//!   `SELECT` of the existing record when the insert-or-take-over did not happen. A fresh
//!   key, a replay, an in-progress duplicate and a mismatch each cost **one round trip**
//!   (a second one only if the record changed concurrently between the statement's
//!   snapshot and the conflict check; see [`PostgresStore`]). A fresh request therefore
//!   costs two (claim, complete) and a retry one. A replay, a `409` and a `422` write
//!   nothing (no row lock, no transaction id, no commit flush), so a burst of retries of
//!   one key runs in parallel instead of queueing on its row. (sqlx 0.9's pool also
//!   pings each connection as it is released, in a background task: wire traffic, but not
//!   on the request's path.)
//! - `renew`, `complete` and `release` are single statements fenced by
//!   `token = $token AND state = 'in_progress'`.
//! - `purge_expired` deletes one batch, skipping rows another session holds locked, so
//!   sweepers on many instances never block each other or a claim.
//!
//! # Migrations
//!
//! The schema (`migrations/postgres/`) is embedded in the binary and applied on connect.
//! sqlx's Postgres migrator holds a session-level advisory lock
//! (`pg_advisory_lock`, keyed by the database name) while it applies migrations, so
//! instances starting at once apply them one after the other; the SQL itself uses
//! `IF NOT EXISTS` as a second line of defence. The applied versions are tracked in
//! `_idempotent_migrations`, not sqlx's default `_sqlx_migrations`, so the store can share
//! a database (and a pool) with an app that runs its own sqlx migrations.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Row, SqlSafeStr, SqlStr};

use super::{
    ClaimOutcome, ClaimRequest, FencingToken, Store, StoreError, StoredResponse, decode_headers,
    encode_headers, retry_after_from_millis,
};

/// The embedded migrations: `(version, description, sql)`, in version order. A unit test
/// checks this list against the files in `migrations/postgres/`.
const MIGRATIONS: &[(i64, &str, &str)] = &[(
    1,
    "idempotency records",
    include_str!("../../migrations/postgres/0001_idempotency_records.sql"),
)];

/// Where applied migration versions are recorded (see the module docs).
const MIGRATIONS_TABLE: &str = "_idempotent_migrations";

/// How long a request waits for a pooled connection before it is answered `503`: while
/// the database is unreachable, requests fail fast instead of hanging for sqlx's default
/// 30 seconds.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long `connect` waits for the first connection before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often `try_claim` re-runs its statement when the record changed between the
/// statement's snapshot and its conflict check. One retry almost always suffices: the
/// next statement's snapshot includes the change.
const CLAIM_ATTEMPTS: usize = 8;

/// TTLs and leases are clamped to this (1000 years) so `now() + interval` stays inside
/// what `timestamptz` can represent.
const MAX_INTERVAL_MICROS: i64 = 1000 * 366 * 24 * 60 * 60 * 1_000_000;

/// A [`Store`] on PostgreSQL: the store for many instances of an app sharing one
/// database, so a retry that lands on another instance still finds the first attempt.
///
/// - **The database's clock.** Every expiry and lease decision and every timestamp uses
///   the server's `now()`; TTL and lease are sent as intervals. Instances' clocks may
///   drift without effect.
/// - **One statement, one round trip per operation.** A fresh request costs two round
///   trips (claim, complete), a replay, an in-progress duplicate or a mismatch one (the
///   claim); a long handler adds one per heartbeat (`renew`).
/// - **Migrations on connect**, embedded in the binary, serialised across instances by
///   sqlx's advisory lock, recorded in `_idempotent_migrations` (not `_sqlx_migrations`,
///   so the store can share a database with an app's own sqlx migrations).
///
/// Cheap to clone (the pool is reference counted).
///
/// ```no_run
/// # async fn demo() -> Result<(), idempotent_runtime::StoreError> {
/// use idempotent_runtime::store::PostgresStore;
///
/// // Its own pool, tables in the connection's default schema (usually `public`):
/// let store = PostgresStore::connect("postgres://app:secret@db/payments").await?;
/// // Or in a dedicated schema, created if missing:
/// let store = PostgresStore::connect_in_schema("postgres://app:secret@db/payments", "idem").await?;
/// // Or sharing the app's pool:
/// let store = PostgresStore::from_pool(store.pool().clone()).await?;
/// # Ok(()) }
/// ```
///
/// # Concurrent changes during a claim
///
/// When the claim does not take the record, the statement reads the existing record to
/// classify it. That read sees the statement's snapshot, while the conflict check sees
/// the newest committed version; if they differ (a duplicate inserted, took over, released
/// or purged the record a moment earlier), the snapshot shows nothing, or a record that
/// looks claimable. The claim then simply runs again (at most a few times), and the new
/// statement's snapshot includes the change.
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    schema: Option<Schema>,
    sql: Arc<Statements>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("location", &describe_options(&self.pool.connect_options()))
            .field("schema", &self.schema.as_ref().map(|s| s.0.as_str()))
            .field("pool_size", &self.pool.size())
            .finish()
    }
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user:password@host:port/database?…`) with a pool of
    /// its own, applies the embedded migrations, and keeps the table in the connection's
    /// default schema (the first existing schema on its `search_path`, usually `public`).
    ///
    /// Fails with [`StoreError::Open`] — naming the URL with its password redacted — when
    /// the URL is invalid or the server cannot be reached within 10 seconds, and with
    /// [`StoreError::Migrate`] when the migrations fail.
    ///
    /// The pool uses sqlx's defaults except that connections are not pinged before each
    /// use (that would double the round trips of every operation); a connection that
    /// died since its last use fails its operation, which the engine answers with `503`.
    /// Build the pool yourself and use [`from_pool`](Self::from_pool) to choose otherwise.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::open(url, None).await
    }

    /// Like [`connect`](Self::connect), but keeps the table in `schema`, which is created
    /// if it does not exist. The schema name must be a plain lower-case identifier
    /// (`[a-z_][a-z0-9_]*`, at most 63 bytes).
    pub async fn connect_in_schema(url: &str, schema: &str) -> Result<Self, StoreError> {
        let schema = Schema::new(schema).map_err(|reason| StoreError::Open {
            location: redact_url(url),
            reason,
        })?;
        Self::open(url, Some(schema)).await
    }

    /// Uses an existing pool, e.g. the app's own, and applies the embedded migrations
    /// through it. The table lives in the pool's default schema.
    ///
    /// Migrations run on a connection that is closed afterwards rather than returned to
    /// the pool, so nothing they set (or a lock a failed run left behind) leaks into the
    /// app's connections.
    pub async fn from_pool(pool: PgPool) -> Result<Self, StoreError> {
        Self::adopt(pool, None).await
    }

    /// Like [`from_pool`](Self::from_pool), but keeps the table in `schema` (created if
    /// missing; same naming rule as [`connect_in_schema`](Self::connect_in_schema)). The
    /// pool's own `search_path` is left alone: the store qualifies its table name.
    pub async fn from_pool_in_schema(pool: PgPool, schema: &str) -> Result<Self, StoreError> {
        let schema = Schema::new(schema).map_err(|reason| StoreError::Open {
            location: describe_options(&pool.connect_options()),
            reason,
        })?;
        Self::adopt(pool, Some(schema)).await
    }

    /// The connection pool, to share with the app (e.g. for its own queries, or for the
    /// transactional unit of work).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The schema the table lives in, when one was chosen explicitly.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_ref().map(|s| s.0.as_str())
    }

    async fn open(url: &str, schema: Option<Schema>) -> Result<Self, StoreError> {
        let open_error = |reason: String| StoreError::Open {
            location: redact_url(url),
            reason,
        };
        let options = PgConnectOptions::from_str(url).map_err(|e| open_error(e.to_string()))?;

        // A direct connection first: it fails fast with the real reason (the pool would
        // retry a refused connection until its acquire timeout, then report only that it
        // timed out), and it runs the migrations.
        let mut conn = tokio::time::timeout(CONNECT_TIMEOUT, options.connect())
            .await
            .map_err(|_| {
                open_error(format!(
                    "no connection within {}s",
                    CONNECT_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| open_error(e.to_string()))?;
        migrate(&mut conn, schema.as_ref()).await?;
        // Closing only says goodbye politely; the migrations are already committed.
        let _ = conn.close().await;

        let pool = PgPoolOptions::new()
            .test_before_acquire(false)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(|e| open_error(e.to_string()))?;
        Ok(Self::with_parts(pool, schema))
    }

    async fn adopt(pool: PgPool, schema: Option<Schema>) -> Result<Self, StoreError> {
        let mut conn = pool.acquire().await.map_err(|e| StoreError::Open {
            location: describe_options(&pool.connect_options()),
            reason: e.to_string(),
        })?;
        conn.close_on_drop();
        migrate(&mut conn, schema.as_ref()).await?;
        drop(conn);
        Ok(Self::with_parts(pool, schema))
    }

    fn with_parts(pool: PgPool, schema: Option<Schema>) -> Self {
        let table = match &schema {
            Some(s) => format!("{}.idempotency_records", s.quoted()),
            None => "idempotency_records".to_owned(),
        };
        Self {
            pool,
            schema,
            sql: Arc::new(Statements::new(&table)),
        }
    }
}

/// Applies the embedded migrations on `conn` (sqlx takes its advisory lock first).
///
/// Calls `Migrator::run_direct` (public, doc-hidden) rather than `Migrator::run`: `run`'s
/// `Acquire<'a>` bound on `&mut PgConnection` makes every future that awaits it fail to
/// prove `Send` ("implementation of `Acquire` is not general enough"), so `connect` could
/// not be awaited inside `tokio::spawn` or an `async_trait` method. sqlx's own comment on
/// `run_direct` names this as its reason to exist; `run` is a thin wrapper around it.
fn migrate<'c>(
    conn: &'c mut PgConnection,
    schema: Option<&'c Schema>,
) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'c>> {
    Box::pin(async move {
        let migrations = MIGRATIONS
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(
                    version,
                    Cow::Borrowed(description),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    false,
                )
            })
            .collect();
        let mut migrator = Migrator::with_migrations(migrations);
        match schema {
            Some(schema) => {
                // Created under the migrator's lock, so concurrent starts do not race on it.
                migrator.create_schema(schema.quoted());
                migrator
                    .dangerous_set_table_name(format!("{}.{MIGRATIONS_TABLE}", schema.quoted()));
                // The migration SQL names its objects unqualified; on this connection they
                // resolve to the schema. (The connection is not reused afterwards.)
                sqlx::query(AssertSqlSafe(format!(
                    "SET search_path TO {}",
                    schema.quoted()
                )))
                .execute(&mut *conn)
                .await?;
            }
            None => {
                migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
            }
        }
        migrator.run_direct(None, conn, false).await?;
        Ok(())
    })
}

/// A schema name checked to be a plain lower-case identifier, so it can be spliced into
/// SQL (always double-quoted) without any escaping question.
#[derive(Debug, Clone)]
struct Schema(String);

impl Schema {
    fn new(name: &str) -> Result<Self, String> {
        let mut chars = name.chars();
        let valid = name.len() <= 63
            && chars
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if valid {
            Ok(Self(name.to_owned()))
        } else {
            Err(format!(
                "invalid schema name {name:?}: use 1 to 63 lower-case ASCII letters, digits \
                 and underscores, not starting with a digit"
            ))
        }
    }

    fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }
}

/// The store's statements, with its table name spliced in once.
#[derive(Debug)]
struct Statements {
    claim: SqlStr,
    renew: SqlStr,
    complete: SqlStr,
    release: SqlStr,
    purge: SqlStr,
}

impl Statements {
    fn new(table: &str) -> Self {
        let sql = |template: &str| AssertSqlSafe(template.replace("{t}", table)).into_sql_str();
        Self {
            claim: sql(CLAIM),
            renew: sql(RENEW),
            complete: sql(COMPLETE),
            release: sql(RELEASE),
            purge: sql(PURGE),
        }
    }
}

/// Insert-or-take-over, and otherwise the existing record, in one statement.
///
/// `$1` scope, `$2` key, `$3` fingerprint digest, `$4` fingerprint version, `$5` token,
/// `$6` ttl, `$7` lease.
///
/// - `existing` reads the record from the statement's snapshot.
/// - `claimed` is the atomic insert-or-take-over. It is only *attempted* when the snapshot
///   shows no record or one this request may take: when it shows a live record this
///   request cannot take (completed, leased, or another fingerprint), the answer comes
///   from the snapshot without writing anything. Attempting anyway would lock the row
///   even though the `DO UPDATE … WHERE` refuses it, which makes every replay and every
///   `409` a write transaction (a transaction id, a WAL record, a commit flush) and makes
///   a burst of retries of one key queue on that row lock. The gate never decides a claim
///   by itself: the claim is still made by the `ON CONFLICT … WHERE` on the newest row
///   version, so skipping on a snapshot at worst answers as of that snapshot.
/// - The final `SELECT` returns the claim, or else the snapshot's record (headers and body
///   only for a completed same-fingerprint record). See [`PostgresStore`] for what a
///   snapshot that disagrees with the conflict check means. Decisions use `now()`; the
///   lease time left uses `clock_timestamp()` (module docs).
const CLAIM: &str = "\
WITH existing AS (
    SELECT state, status, headers, body, expires_at, lease_expires_at,
           (fingerprint = $3 AND fingerprint_version = $4) AS same_fingerprint
    FROM {t}
    WHERE scope = $1 AND key = $2
),
claimed AS (
    INSERT INTO {t} AS r
        (scope, key, fingerprint, fingerprint_version, state, token,
         lease_expires_at, status, headers, body, created_at, expires_at)
    SELECT $1, $2, $3, $4, 'in_progress', $5,
           now() + $7, NULL, NULL, NULL, now(), now() + $6
    WHERE NOT EXISTS (
        SELECT 1 FROM existing e
        WHERE NOT (e.expires_at <= now()
                   AND (e.state = 'completed' OR e.lease_expires_at <= now()))
          AND NOT (e.state = 'in_progress' AND e.lease_expires_at <= now()
                   AND e.same_fingerprint))
    ON CONFLICT (scope, key) DO UPDATE SET
        fingerprint = EXCLUDED.fingerprint,
        fingerprint_version = EXCLUDED.fingerprint_version,
        state = 'in_progress',
        token = EXCLUDED.token,
        lease_expires_at = EXCLUDED.lease_expires_at,
        status = NULL,
        headers = NULL,
        body = NULL,
        created_at = EXCLUDED.created_at,
        expires_at = EXCLUDED.expires_at
    WHERE (r.expires_at <= now()
           AND (r.state = 'completed' OR r.lease_expires_at <= now()))
       OR (r.state = 'in_progress'
           AND r.lease_expires_at <= now()
           AND r.fingerprint = EXCLUDED.fingerprint
           AND r.fingerprint_version = EXCLUDED.fingerprint_version)
    RETURNING 1
)
SELECT TRUE AS claimed,
       NULL::text AS state,
       NULL::boolean AS same_fingerprint,
       NULL::boolean AS claimable,
       NULL::bigint AS lease_remaining_ms,
       NULL::smallint AS status,
       NULL::bytea AS headers,
       NULL::bytea AS body
FROM claimed
UNION ALL
SELECT FALSE,
       e.state,
       e.same_fingerprint,
       (e.expires_at <= now() AND (e.state = 'completed' OR e.lease_expires_at <= now()))
           OR (e.state = 'in_progress' AND e.lease_expires_at <= now() AND e.same_fingerprint),
       ceil(extract(epoch FROM e.lease_expires_at - clock_timestamp()) * 1000)::bigint,
       CASE WHEN e.same_fingerprint THEN e.status END,
       CASE WHEN e.same_fingerprint THEN e.headers END,
       CASE WHEN e.same_fingerprint THEN e.body END
FROM existing e
WHERE NOT EXISTS (SELECT 1 FROM claimed)";

/// `$1` scope, `$2` key, `$3` token, `$4` lease.
const RENEW: &str = "\
UPDATE {t} SET lease_expires_at = now() + $4, expires_at = GREATEST(expires_at, now() + $4)
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'";

/// `$1` scope, `$2` key, `$3` token, `$4` status, `$5` headers, `$6` body (NULL: over the
/// cap).
const COMPLETE: &str = "\
UPDATE {t} SET state = 'completed', status = $4, headers = $5, body = $6
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'";

/// `$1` scope, `$2` key, `$3` token.
const RELEASE: &str = "\
DELETE FROM {t}
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_progress'";

/// `$1` batch size. Rows locked elsewhere (a claim taking one over, another sweeper) are
/// skipped, not waited for; the outer condition re-checks expiry on the locked row.
const PURGE: &str = "\
DELETE FROM {t}
WHERE (scope, key) IN (SELECT scope, key FROM {t}
                       WHERE expires_at <= now()
                         AND (state = 'completed' OR lease_expires_at <= now())
                       LIMIT $1
                       FOR UPDATE SKIP LOCKED)
  AND expires_at <= now()
  AND (state = 'completed' OR lease_expires_at <= now())";

/// A `Duration` as a Postgres interval of whole microseconds, clamped (see
/// [`MAX_INTERVAL_MICROS`]).
fn interval(duration: Duration) -> PgInterval {
    let micros = i64::try_from(duration.as_micros()).unwrap_or(i64::MAX);
    PgInterval {
        months: 0,
        days: 0,
        microseconds: micros.min(MAX_INTERVAL_MICROS),
    }
}

/// What one run of the claim statement found.
enum Attempt {
    /// The caller's claim took the record.
    Claimed,
    /// The record is someone else's: replay, in progress or mismatch.
    Decided(ClaimOutcome),
    /// The record changed between the snapshot and the conflict check: run again.
    Raced,
}

fn classify(row: &PgRow) -> Result<Attempt, StoreError> {
    if row.try_get::<bool, _>("claimed")? {
        return Ok(Attempt::Claimed);
    }
    if row
        .try_get::<Option<bool>, _>("claimable")?
        .unwrap_or(false)
    {
        return Ok(Attempt::Raced);
    }
    if !row
        .try_get::<Option<bool>, _>("same_fingerprint")?
        .unwrap_or(false)
    {
        return Ok(Attempt::Decided(ClaimOutcome::Mismatch));
    }
    let state: Option<String> = row.try_get("state")?;
    match state.as_deref() {
        Some("completed") => {
            let status: Option<i16> = row.try_get("status")?;
            let status = status
                .and_then(|s| u16::try_from(s).ok())
                .ok_or_else(|| StoreError::Corrupt("completed record without a status".into()))?;
            let headers: Option<Vec<u8>> = row.try_get("headers")?;
            let headers =
                decode_headers(headers.as_deref().ok_or_else(|| {
                    StoreError::Corrupt("completed record without headers".into())
                })?)?;
            let body: Option<Vec<u8>> = row.try_get("body")?;
            Ok(Attempt::Decided(ClaimOutcome::Replay(StoredResponse {
                status,
                headers,
                body: body.map(Bytes::from),
            })))
        }
        Some("in_progress") => {
            let remaining: Option<i64> = row.try_get("lease_remaining_ms")?;
            Ok(Attempt::Decided(ClaimOutcome::InProgress {
                retry_after: retry_after_from_millis(remaining.unwrap_or(0)),
            }))
        }
        other => Err(StoreError::Corrupt(format!(
            "unknown record state {other:?}"
        ))),
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn try_claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let ttl = interval(claim.ttl);
        let lease = interval(claim.lease);
        for attempt in 1..=CLAIM_ATTEMPTS {
            let row = sqlx::query(self.sql.claim.clone())
                .bind(claim.scope)
                .bind(claim.key)
                .bind(&claim.fingerprint.digest[..])
                .bind(claim.fingerprint.version)
                .bind(claim.token.0)
                .bind(ttl)
                .bind(lease)
                .fetch_optional(&self.pool)
                .await?;
            let found = match &row {
                Some(row) => classify(row)?,
                // The conflicting record is not in the snapshot: inserted concurrently.
                None => Attempt::Raced,
            };
            match found {
                Attempt::Claimed => return Ok(ClaimOutcome::Claimed { token: claim.token }),
                Attempt::Decided(outcome) => return Ok(outcome),
                Attempt::Raced => {
                    tracing::debug!(attempt, "idempotency record changed during claim; retrying");
                }
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
        let done = sqlx::query(self.sql.renew.clone())
            .bind(scope)
            .bind(key)
            .bind(token.0)
            .bind(interval(lease))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn complete(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        complete_on(&self.sql, &self.pool, scope, key, token, response).await
    }

    async fn release(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(self.sql.release.clone())
            .bind(scope)
            .bind(key)
            .bind(token.0)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn purge_expired(&self, limit: u32) -> Result<u64, StoreError> {
        if limit == 0 {
            return Ok(0);
        }
        let done = sqlx::query(self.sql.purge.clone())
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    fn sql_pool(&self) -> Option<super::SqlPool> {
        Some(super::SqlPool::Postgres(PostgresPool {
            pool: self.pool.clone(),
            schema: self.schema.clone(),
            sql: self.sql.clone(),
        }))
    }
}

/// The fenced completion on any Postgres executor: the pool, or the connection of a
/// transactional handler's transaction.
async fn complete_on<'e>(
    sql: &Statements,
    executor: impl sqlx::PgExecutor<'e>,
    scope: &str,
    key: &str,
    token: FencingToken,
    response: &StoredResponse,
) -> Result<bool, StoreError> {
    let status = i16::try_from(response.status).map_err(|_| {
        StoreError::Corrupt(format!(
            "status {} does not fit the schema",
            response.status
        ))
    })?;
    let done = sqlx::query(sql.complete.clone())
        .bind(scope)
        .bind(key)
        .bind(token.0)
        .bind(status)
        .bind(encode_headers(&response.headers))
        .bind(response.body.as_deref())
        .execute(executor)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// A [`PostgresStore`]'s pool together with where its records live (the table, in the
/// store's schema if it has one): what [`Store::sql_pool`] returns for Postgres, so a
/// transactional handler's completion finds the store's table from the pool alone — a
/// decorator store that forwards `sql_pool()` works like the store itself.
///
/// Only a `PostgresStore` makes one (the table name is spliced into SQL); a decorator
/// passes it on unchanged.
#[derive(Clone)]
pub struct PostgresPool {
    pool: PgPool,
    schema: Option<Schema>,
    sql: Arc<Statements>,
}

impl PostgresPool {
    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The schema the store's table lives in, when one was chosen explicitly (as
    /// [`PostgresStore::schema`]).
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_ref().map(|s| s.0.as_str())
    }
}

impl std::fmt::Debug for PostgresPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresPool")
            .field("location", &describe_options(&self.pool.connect_options()))
            .field("schema", &self.schema())
            .finish_non_exhaustive()
    }
}

/// Transactional handlers (`Tx<Postgres>`, DESIGN §5): the completion runs inside the
/// handler's transaction, on the store's (possibly schema-qualified) table, as carried by
/// the [`PostgresPool`] its `sql_pool()` returns.
#[async_trait]
impl crate::transaction::TxDatabase for sqlx::Postgres {
    const DATABASE_NAME: &'static str = "Postgres";

    fn pool_of(store: &dyn Store) -> Option<sqlx::Pool<Self>> {
        match store.sql_pool()? {
            super::SqlPool::Postgres(pg) => Some(pg.pool),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    async fn complete_in(
        conn: &mut PgConnection,
        store: &dyn Store,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        let sql = match store.sql_pool() {
            Some(super::SqlPool::Postgres(pg)) => pg.sql,
            _ => {
                return Err(StoreError::Database(sqlx::Error::Configuration(
                    format!("the store no longer offers a Postgres pool: {store:?}").into(),
                )));
            }
        };
        complete_on(&sql, conn, scope, key, token, response).await
    }
}

/// `url` with any password replaced by `***`: in the user-info part
/// (`postgres://user:***@host/db`) and in a `password=` query parameter.
fn redact_url(url: &str) -> String {
    let (base, fragment) = match url.find('#') {
        Some(i) => url.split_at(i),
        None => (url, ""),
    };
    let (before_query, query) = match base.find('?') {
        Some(i) => (&base[..i], Some(&base[i + 1..])),
        None => (base, None),
    };
    let mut out = String::with_capacity(url.len());
    match before_query.find("://") {
        Some(scheme_end) => {
            let rest = &before_query[scheme_end + 3..];
            let authority_end = rest.find('/').unwrap_or(rest.len());
            let (authority, path) = rest.split_at(authority_end);
            out.push_str(&before_query[..scheme_end + 3]);
            match authority.rfind('@') {
                Some(at) => {
                    let (userinfo, host) = authority.split_at(at);
                    match userinfo.find(':') {
                        Some(colon) => {
                            out.push_str(&userinfo[..colon]);
                            out.push_str(":***");
                        }
                        None => out.push_str(userinfo),
                    }
                    out.push_str(host);
                }
                None => out.push_str(authority),
            }
            out.push_str(path);
        }
        None => out.push_str(before_query),
    }
    if let Some(query) = query {
        out.push('?');
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((name, _)) if name.eq_ignore_ascii_case("password") => {
                    format!("{name}=***")
                }
                _ => param.to_owned(),
            })
            .collect();
        out.push_str(&params.join("&"));
    }
    out.push_str(fragment);
    out
}

/// Where a pool connects, for error messages: `postgres://user@host:port/db`. Connect
/// options never reveal the password, so there is nothing to redact.
fn describe_options(options: &PgConnectOptions) -> String {
    let host = match options.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    };
    format!(
        "postgres://{}@{}/{}",
        options.get_username(),
        host,
        options.get_database().unwrap_or("")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://user:s3cr%40t@db.example:5432/app?sslmode=require"),
            "postgres://user:***@db.example:5432/app?sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://:pw@host/db"),
            "postgres://:***@host/db"
        );
        assert_eq!(
            redact_url("postgresql://user@host/db?password=hunter2&application_name=x"),
            "postgresql://user@host/db?password=***&application_name=x"
        );
        // An `@` inside the password: the host starts after the last one.
        assert_eq!(redact_url("postgres://u:a@b@host"), "postgres://u:***@host");
        assert_eq!(
            redact_url("postgres://host:5432/db"),
            "postgres://host:5432/db"
        );
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn checks_schema_names() {
        for good in ["idem", "_x", "a1_b2", &"s".repeat(63)] {
            assert!(Schema::new(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "1abc",
            "Idem",
            "a-b",
            "a b",
            "a\"b",
            "ä",
            &"s".repeat(64),
        ] {
            assert!(Schema::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn embeds_every_migration_file() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/postgres");
        let mut on_disk: Vec<(i64, String)> = std::fs::read_dir(&dir)
            .expect("migrations directory")
            .map(|entry| {
                let path = entry.expect("directory entry").path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                let version = name.split('_').next().unwrap().parse().expect("version");
                (
                    version,
                    std::fs::read_to_string(&path).expect("migration file"),
                )
            })
            .collect();
        on_disk.sort();
        let embedded: Vec<(i64, String)> = MIGRATIONS
            .iter()
            .map(|&(version, _, sql)| (version, sql.to_owned()))
            .collect();
        assert_eq!(embedded, on_disk);
    }

    #[test]
    fn clamps_intervals() {
        assert_eq!(
            interval(Duration::from_millis(1500)).microseconds,
            1_500_000
        );
        assert_eq!(interval(Duration::MAX).microseconds, MAX_INTERVAL_MICROS);
    }
}
