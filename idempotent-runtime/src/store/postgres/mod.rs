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
//! operation is one autocommit statement (concurrent claims share one, see group commit
//! below), so that is the current time, and it is the *same* value everywhere inside the
//! statement: the claim's take-over decision, the
//! timestamps it writes and the classification of the record it found all agree. The one
//! exception is the `Retry-After` of an in-progress duplicate, computed from
//! `clock_timestamp()` (the real time when the row is read): a claim whose statement began
//! a moment before the holder's (and then found the holder's committed row) would
//! otherwise see more than a full lease left.
//!
//! # One statement per operation, shared by concurrent requests
//!
//! - `claim` is a single statement: an `INSERT … ON CONFLICT (scope, key) DO UPDATE
//!   … WHERE <expired, or lease ran out with the same fingerprint>` inside a CTE, plus a
//!   `SELECT` of the existing record when the insert-or-take-over did not happen. A fresh
//!   key, a replay, an in-progress duplicate and a mismatch each cost **one round trip**
//!   (a second one only if the record changed concurrently between the statement's
//!   snapshot and the conflict check; see [`PostgresStore`]). A fresh request therefore
//!   costs two (claim, complete) and a retry one. A replay, a `409` and a `422` write
//!   nothing to their own row (no row lock).
//! - **Group commit** (`group_commit.rs`): concurrent claims share that statement — it
//!   takes arrays, one element per claim, and answers each — and so do concurrent
//!   completions (`sql/complete_batch.sql`). Under load a round trip, a transaction and
//!   a WAL flush serve a whole batch instead of one request; alone, a claim is a batch of
//!   one and costs what it did.
//!   One batch runs at a time per statement, bounded in time; duplicates of a key wait
//!   for the next batch unless their answer follows from the first's.
//! - Claims, completions, `renew` and `release` run on connections taken from the pool
//!   and kept by the store (`connections.rs`): sqlx 0.9's pool pings every connection
//!   given back to it, a round trip per operation, and a cached generic plan for the
//!   batch statements can go bad as the table grows.
//! - `renew`, `complete`, `release` and `record_step` are fenced by `token = $token AND
//!   state = 'in_progress'`.
//!
//! # Recovery points: the `steps` column
//!
//! A record keeps the steps its handler completed in one nullable `bytea` column
//! (migration 4), the concatenation of [`encode_step`] in recording order; NULL is none.
//!
//! - `record_step` (and `record_step_in`, on a transactional handler's connection) is one
//!   fenced `UPDATE` appending one encoded step (`sql/record_step.sql`).
//! - The claim statement keeps the steps when it takes a record over for a lost lease and
//!   clears them for an expired one, and answers with the steps of the row it wrote (its
//!   `RETURNING`), never the snapshot's: Postgres runs READ COMMITTED, and the takeover's
//!   `DO UPDATE` acts on the newest committed version of the row, so a step the old owner
//!   committed while the claim waited for the row lock is in the answer, and one it tries
//!   after the takeover finds another token and is refused. A key without steps reads a
//!   NULL column, nothing more.
//! - Completion sets the column to NULL (the response replaces the steps).
//! - `release` is one statement (`sql/release.sql`): a record without steps is deleted as
//!   before; one with steps is kept in progress with its lease ended at `now()`, its token
//!   set to [`FencingToken::RELEASED`] and `waited` cleared, which notifies its waiters
//!   like the delete (see below).
//! - `inspect` and `forget` report an in-progress record's steps; `forget` deletes them
//!   with the row; `purge_expired` is unchanged (the TTL covers them).
//! - `purge_expired` deletes one batch, the oldest expired records by a range scan of the
//!   expiry index, by row address, skipping rows another session holds locked, so
//!   sweepers on many instances never block each other or a claim.
//! - `inspect` (operators) is one read at `now()`; `forget` is that read, then a `DELETE`
//!   fenced by the token and state it read (run again if the record changed between).
//!
//! # Waiting duplicates: `LISTEN/NOTIFY`
//!
//! A duplicate that waits for a running original (`wait = "5s"`) on another instance is
//! woken by a notification: before it waits, it marks the in-progress record
//! (`waited`, `sql/mark_waited.sql`), and the triggers of migrations 2 to 4 `pg_notify`
//! the channel `idempotent_claim_ended` when a *marked* claim completes or is released
//! (deleted, or kept for its steps: the release clears `waited`, and migration 4's trigger
//! fires on that), with a hash of scope and key as payload. A record whose lease already
//! ended (its holder crashed, or released it keeping its steps) is not marked: the
//! duplicate claims again at once and takes it over or is refused. Only marked records
//! notify: `NOTIFY` serialises the commits of notifying transactions, so notifying on
//! every completion would serialise every fresh key's completion. Each store keeps one listener
//! connection for it, on a one-connection pool of its own (never one of the request
//! pool's), started on the first wait and reconnected when lost; waiters poll while it is
//! down (see `notify.rs`).
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

use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::{PgArguments, PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Postgres, Row, SqlStr};

use super::sql::operator::OperatorStatements;
use super::sql::{self, EmbeddedMigration};
use super::{
    Capabilities, ClaimAnswer, ClaimRequest, ClaimWatch, FencingToken, ForgetOutcome, RecordInfo,
    RecordedStep, Store, StoreError, StoredResponse, TxSupport, WatchClaims, encode_step,
};
use claim::QueuedClaim;
use completion::QueuedCompletion;
use connections::StatementConnections;
use group_commit::Batcher;
use schema::{Schema, Statements};

mod claim;
mod completion;
mod connections;
mod group_commit;
mod notify;
mod operator;
mod schema;
mod transaction;

/// The embedded migrations, in version order; the files live in `migrations/postgres/`.
const MIGRATIONS: &[EmbeddedMigration] = &[
    EmbeddedMigration {
        version: 1,
        description: "idempotency records",
        sql: include_str!("../../../migrations/postgres/0001_idempotency_records.sql"),
    },
    EmbeddedMigration {
        version: 2,
        description: "claim ended notify",
        sql: include_str!("../../../migrations/postgres/0002_claim_ended_notify.sql"),
    },
    EmbeddedMigration {
        version: 3,
        description: "notify only waited claims",
        sql: include_str!("../../../migrations/postgres/0003_notify_only_waited_claims.sql"),
    },
    EmbeddedMigration {
        version: 4,
        description: "recorded steps",
        sql: include_str!("../../../migrations/postgres/0004_recorded_steps.sql"),
    },
];

/// Where applied migration versions are recorded (see the module docs).
const MIGRATIONS_TABLE: &str = "_idempotent_migrations";

/// How long a request waits for a pooled connection before it is answered `503`: while
/// the database is unreachable, requests fail fast instead of hanging for sqlx's default
/// 30 seconds.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long `connect` waits for the first connection before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// TTLs and leases are clamped to this (1000 years) so `now() + interval` stays inside
/// what `timestamptz` can represent.
const MAX_INTERVAL_MICROS: i64 = 1000 * 366 * 24 * 60 * 60 * 1_000_000;

/// A [`Store`] on PostgreSQL: the store for many instances of an app sharing one
/// database, so a retry that lands on another instance still finds the first attempt.
///
/// - **The database's clock.** Every expiry and lease decision and every timestamp uses
///   the server's `now()`; TTL and lease are sent as intervals. Instances' clocks may
///   drift without effect.
/// - **One statement, one round trip per operation, shared under load.** A fresh request
///   costs two round trips (claim, complete), a replay, an in-progress duplicate or a
///   mismatch one (the claim); a long handler adds one per heartbeat (`renew`) and one
///   per recorded step (`record_step`).
///   Concurrent claims share one statement, and so do concurrent completions (group
///   commit): one round trip and one commit for a whole batch.
/// - **Connections.** The pool (yours with [`from_pool`](Self::from_pool)) serves
///   migrations, the transactional unit of work, purges and operators. Claims,
///   completions, renewals and releases run on connections the store takes from the pool
///   and keeps (detached, so the pool may open replacements): at most the pool's
///   `max_connections` of them, about two in practice, never pinged when given back,
///   with `plan_cache_mode = force_custom_plan` (PostgreSQL 12 or later). A waiting
///   handler's `LISTEN` has one more of its own.
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
    transactions: TxSupport,
    /// Where claims, renewals, completions and releases run (`connections.rs`).
    connections: Arc<StatementConnections>,
    /// Claims, batched into shared statements (`group_commit.rs`).
    claims: Batcher<QueuedClaim>,
    /// Completions outside a transaction, batched likewise.
    completions: Batcher<QueuedCompletion>,
    /// Wakes duplicates waiting for a claim to end (`LISTEN/NOTIFY`).
    notifier: Arc<notify::Notifier>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("location", &describe_options(&self.pool.connect_options()))
            .field("schema", &self.schema.as_ref().map(Schema::name))
            .field("pool_size", &self.pool.size())
            .field("statement_connections", &self.connections)
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
    /// use (that would double the round trips of every operation). Claims and
    /// completions run on connections the store keeps (see [`PostgresStore`]); one that
    /// died since its last use fails the batch that finds it, which the engine answers
    /// with `503`, and is replaced. Build the pool yourself and use
    /// [`from_pool`](Self::from_pool) to choose its size, timeouts and hooks.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::open(url, None).await
    }

    /// Like [`connect`](Self::connect), but keeps the table in `schema`, which is created
    /// if it does not exist. The schema name must be a plain lower-case identifier
    /// (`[a-z_][a-z0-9_]*`, at most 63 bytes).
    pub async fn connect_in_schema(url: &str, schema: &str) -> Result<Self, StoreError> {
        let schema = Schema::new(schema).map_err(|reason| StoreError::Open {
            location: sql::redact_url(url),
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
        self.schema.as_ref().map(Schema::name)
    }

    async fn open(url: &str, schema: Option<Schema>) -> Result<Self, StoreError> {
        let open_error = |reason: String| StoreError::Open {
            location: sql::redact_url(url),
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
        let sql = Arc::new(Statements::new(schema.as_ref()));
        let transactions = transaction::support(pool.clone(), sql.clone());
        let notifier = Arc::new(notify::Notifier::new((*pool.connect_options()).clone()));
        let connections = Arc::new(StatementConnections::like(&pool));
        let claims = group_commit::start(sql.claim.clone(), connections.clone());
        let completions = group_commit::start(sql.complete_batch.clone(), connections.clone());
        Self {
            pool,
            schema,
            sql,
            transactions,
            connections,
            claims,
            completions,
            notifier,
        }
    }

    /// Runs one statement that writes on a statement connection; the rows it affected.
    async fn execute(&self, query: Query<'_, Postgres, PgArguments>) -> Result<u64, StoreError> {
        let mut lent = self.connections.acquire().await?;
        let done = query.execute(lent.connection()).await?;
        lent.release();
        Ok(done.rows_affected())
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
        let table = match schema {
            Some(schema) => format!("{}.{MIGRATIONS_TABLE}", schema.quoted()),
            None => MIGRATIONS_TABLE.to_owned(),
        };
        // The migrations are written to be re-run (`IF NOT EXISTS`, `DROP … IF EXISTS`),
        // and Postgres answers each step it skips with a NOTICE, which sqlx logs at INFO
        // (`… does not exist, skipping`, `… already exists, skipping`): lines that read
        // like errors on every start. Warnings and errors still reach the log. (The
        // connection is not reused afterwards.)
        sqlx::query("SET client_min_messages TO warning")
            .execute(&mut *conn)
            .await?;
        let mut migrator = sql::migrator(MIGRATIONS, table);
        if let Some(schema) = schema {
            // Created under the migrator's lock, so concurrent starts do not race on it.
            migrator.create_schema(schema.quoted());
            // The migration SQL names its objects unqualified; on this connection they
            // resolve to the schema. (The connection is not reused afterwards.)
            sqlx::query(AssertSqlSafe(format!(
                "SET search_path TO {}",
                schema.quoted()
            )))
            .execute(&mut *conn)
            .await?;
        }
        migrator.run_direct(None, conn, false).await?;
        Ok(())
    })
}

/// `sql/record_step.sql` with its parameters bound: scope, key, token, the encoded step.
/// Run on a statement connection, or on a transactional handler's.
fn bind_record_step(
    sql: SqlStr,
    scope: &str,
    key: &str,
    token: FencingToken,
    step: &RecordedStep,
) -> Query<'static, Postgres, PgArguments> {
    sqlx::query(sql)
        .bind(scope.to_owned())
        .bind(key.to_owned())
        .bind(token.0)
        .bind(encode_step(step))
}

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

#[async_trait]
impl Store for PostgresStore {
    async fn claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimAnswer, StoreError> {
        let (outcome, replay_lives_for) =
            sql::claim_with_retries(claim, || self.claim_once(claim)).await?;
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
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let renew = sqlx::query(self.sql.renew.clone())
            .bind(scope)
            .bind(key)
            .bind(token.0)
            .bind(interval(lease))
            .bind(interval(ttl));
        Ok(self.execute(renew).await? == 1)
    }

    async fn complete(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        let completion = QueuedCompletion::new((scope, key), token, response)?;
        self.completions.ask(completion).await
    }

    async fn release(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        let release = sqlx::query(self.sql.release.clone())
            .bind(scope)
            .bind(key)
            .bind(token.0)
            .bind(FencingToken::RELEASED.0);
        let mut lent = self.connections.acquire().await?;
        let released: i64 = release
            .fetch_one(lent.connection())
            .await?
            .try_get("released")?;
        lent.release();
        Ok(released == 1)
    }

    async fn record_step(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        step: &RecordedStep,
    ) -> Result<bool, StoreError> {
        let record = bind_record_step(self.sql.record_step.clone(), scope, key, token, step);
        Ok(self.execute(record).await? == 1)
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

    async fn inspect(&self, scope: &str, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        self.inspect_record(scope, key).await
    }

    async fn forget(
        &self,
        scope: &str,
        key: &str,
        force: bool,
    ) -> Result<ForgetOutcome, StoreError> {
        self.forget_record(scope, key, force).await
    }

    fn capabilities(&self) -> Capabilities {
        let watch = NotifiedWatch {
            notifier: self.notifier.clone(),
            connections: self.connections.clone(),
            sql: self.sql.clone(),
        };
        Capabilities::none()
            .with_transactions(self.transactions.clone())
            .with_watch(Arc::new(watch))
    }
}

/// The store's change notifications: `LISTEN/NOTIFY` on the claims a duplicate waits for.
#[derive(Debug)]
struct NotifiedWatch {
    notifier: Arc<notify::Notifier>,
    connections: Arc<StatementConnections>,
    sql: Arc<Statements>,
}

impl WatchClaims for NotifiedWatch {
    fn watch_claim(&self, scope: &str, key: &str, poll: Duration) -> ClaimWatch {
        // Subscribed now (before the engine's claim); the record is marked once the claim
        // found it in progress, so that its end notifies (only marked records notify:
        // see migration 3).
        let notified = self.notifier.watch(scope, key, poll);
        let (connections, mark) = (self.connections.clone(), self.sql.mark_waited.clone());
        let (scope, key) = (scope.to_owned(), key.to_owned());
        Box::pin(async move {
            let watched = async {
                let mut lent = connections.acquire().await?;
                let row = sqlx::query(mark)
                    .bind(&scope)
                    .bind(&key)
                    .fetch_one(lent.connection())
                    .await?;
                lent.release();
                row.try_get::<bool, _>("watched")
            }
            .await;
            match watched {
                // Ended or changed since the claim: claim again now.
                Ok(false) => {}
                // Marked; or the mark failed, and the poll and re-check bound the wait.
                Ok(true) | Err(_) => notified.await,
            }
        })
    }
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
    fn embeds_every_migration_file() {
        sql::assert_embedded_migrations_match("postgres", MIGRATIONS);
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
