//! [`PostgresStore`]: the store for many instances sharing one PostgreSQL database.
//!
//! This is how the system scales past one machine: every instance of the app talks to the
//! same `idempotency_records` table, so a retry that lands on another instance still finds
//! the first attempt's claim or recorded response.
//!
//! # A fenced record register
//!
//! The store keeps records and decides nothing: `records.rs` implements
//! [`RecordStore`](crate::store::RecordStore) (insert unless present, read,
//! compare-and-set on the `version` column, delete by version, the sweeper's candidates),
//! one statement each (`sql/`), and [`Fenced`] runs the protocol over it. The takeover
//! rule, which steps survive, whether a release keeps a record and what operators see are
//! the engine's ([`crate::fenced::rules`]), as for every store on the seam.
//!
//! Round trips: a fresh key one (the insert) and its completion one; a replay, an
//! in-progress duplicate or a mismatch one (the insert answers the record it found); a
//! renewal and a step one each; a takeover two (the insert, then a compare-and-set); a
//! release two (a read, then a delete or a compare-and-set). A concurrent change between
//! a statement's snapshot and its write adds a read (see `records.rs`).
//!
//! **Group commit** (`group.rs`): concurrent inserts share one statement, and so do
//! concurrent completions (the `Complete` compare-and-set), so under load one round
//! trip, one transaction and one WAL flush serve a whole batch; alone, an operation is a
//! batch of one.
//!
//! # One clock: the database's
//!
//! Instances' clocks drift. Every expiry and lease, and every timestamp written, is on the
//! database's clock, never the app's: TTL and lease travel to the server as `interval`
//! parameters and the server computes `now() + interval`; every answer carries the
//! database's clock, which the engine judges the record on.
//!
//! # Connections
//!
//! Record operations run on connections taken from the pool and kept by the store
//! (`connections.rs`): sqlx 0.9's pool pings every connection given back to it, a round
//! trip per operation.
//!
//! # Transactional handlers
//!
//! A `Tx<Postgres>` handler's completion and atomic steps are the owner's compare-and-set
//! on its transaction's connection ([`Fenced::transactions`]): they commit or roll back
//! with the handler's writes, and a takeover that committed first makes them stale.
//!
//! # Waiting duplicates: `LISTEN/NOTIFY`
//!
//! A duplicate that waits for a running original (`wait = "5s"`) on another instance is
//! woken by a notification: before it waits, it marks the in-progress record
//! (`waited`, `sql/mark_waited.sql`), and the triggers of migrations 2 to 4 `pg_notify`
//! the channel `idempotent_claim_ended` when a *marked* claim completes or is released
//! (deleted, or kept for its steps: ending the lease clears `waited`, and migration 4's
//! trigger fires on that), with a hash of scope and key as payload. A record whose lease
//! already ended (its holder crashed, or released it keeping its steps) is not marked:
//! the duplicate claims again at once and takes it over or is refused. Only marked
//! records notify: `NOTIFY` serialises the commits of notifying transactions, so
//! notifying on every completion would serialise every fresh key's completion. Each store
//! keeps one listener connection for it, on a one-connection pool of its own (never one
//! of the request pool's), started on the first wait and reconnected when lost; waiters
//! poll while it is down (see `notify.rs`).
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

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Postgres, Row, SqlStr};

use super::sql::{self, EmbeddedMigration};
use super::{
    Capabilities, ClaimWatch, Forward, RecordStore, Store, StoreError, TxSupport, WatchClaims,
};
use crate::fenced::Fenced;
use connections::StatementConnections;
use records::PgRecords;
use schema::Schema;

mod connections;
mod group;
mod notify;
mod records;
mod schema;

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
    EmbeddedMigration {
        version: 5,
        description: "record versions",
        sql: include_str!("../../../migrations/postgres/0005_record_versions.sql"),
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

/// A [`Store`] on PostgreSQL: the store for many instances of an app sharing one
/// database, so a retry that lands on another instance still finds the first attempt.
///
/// - **The database's clock.** Every expiry and lease decision and every timestamp uses
///   the server's `now()`; TTL and lease are sent as intervals. Instances' clocks may
///   drift without effect.
/// - **One statement, one round trip per operation, shared under load.** A fresh request
///   costs two round trips (claim, complete), a replay, an in-progress duplicate or a
///   mismatch one (the claim); a long handler adds one per heartbeat (`renew`) and one
///   per recorded step (`record_step`); a takeover costs two. Every write is a
///   compare-and-set on the record's version; the protocol's decisions are the engine's.
///   Concurrent claims share one statement, and so do concurrent completions (group
///   commit).
/// - **Connections.** The pool (yours with [`from_pool`](Self::from_pool)) serves
///   migrations, the transactional unit of work and purges. Record operations run on
///   connections the store takes from the pool and keeps (detached, so the pool may open
///   replacements): at most the pool's `max_connections` of them, never pinged when
///   given back. A waiting handler's `LISTEN` has one more of its own.
/// - **Migrations on connect**, embedded in the binary, serialised across instances by
///   sqlx's advisory lock, recorded in `_idempotent_migrations` (not `_sqlx_migrations`,
///   so the store can share a database with an app's own sqlx migrations).
///
/// Cheap to clone (the pool is reference counted); clones share the owners' versions.
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
#[derive(Clone)]
pub struct PostgresStore {
    /// The protocol over the table: a cheap clone shares the owners' versions.
    fenced: Arc<Fenced<PgRecords>>,
    /// Transactional handlers' writes, sharing those versions.
    transactions: TxSupport,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let records = self.fenced.records();
        f.debug_struct("PostgresStore")
            .field(
                "location",
                &describe_options(&records.pool.connect_options()),
            )
            .field("schema", &records.schema.as_ref().map(Schema::name))
            .field("pool_size", &records.pool.size())
            .finish_non_exhaustive()
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
        &self.fenced.records().pool
    }

    /// The record register under the store: what the protocol reads and writes, one
    /// statement per operation (see the module docs).
    pub fn records(&self) -> &impl RecordStore {
        self.fenced.records()
    }

    /// The schema the table lives in, when one was chosen explicitly.
    pub fn schema(&self) -> Option<&str> {
        self.fenced.records().schema.as_ref().map(Schema::name)
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
        let fenced = Fenced::new(PgRecords::new(pool, schema));
        let transactions = fenced.transactions::<Postgres>();
        Self {
            fenced: Arc::new(fenced),
            transactions,
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

/// Every operation is the protocol's over the table ([`Fenced`]); the store adds the
/// transactional handlers, whose writes share the owners' versions.
impl Forward for PostgresStore {
    fn inner(&self) -> &dyn Store {
        &*self.fenced
    }

    fn capabilities(&self) -> Capabilities {
        self.fenced
            .capabilities()
            .with_transactions(self.transactions.clone())
    }
}

/// The store's change notifications: `LISTEN/NOTIFY` on the claims a duplicate waits for.
#[derive(Debug)]
struct NotifiedWatch {
    notifier: Arc<notify::Notifier>,
    connections: Arc<StatementConnections>,
    /// `sql/mark_waited.sql`.
    mark: SqlStr,
}

impl WatchClaims for NotifiedWatch {
    fn watch_claim(&self, scope: &str, key: &str, poll: Duration) -> ClaimWatch {
        // Subscribed now (before the engine's claim); the record is marked once the claim
        // found it in progress, so that its end notifies (only marked records notify:
        // see migration 3).
        let notified = self.notifier.watch(scope, key, poll);
        let (connections, mark) = (self.connections.clone(), self.mark.clone());
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
}
