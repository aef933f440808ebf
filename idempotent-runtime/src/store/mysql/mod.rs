//! [`MySqlStore`]: the store for many instances sharing one MySQL 8 or MariaDB 10.6+
//! database.
//!
//! Like `PostgresStore`, every instance of the app talks to the same
//! `idempotency_records` table, so a retry that lands on another instance still finds the
//! first attempt's claim or recorded response.
//!
//! # A fenced record register
//!
//! The store keeps records and decides nothing: `records.rs` implements
//! [`RecordStore`](crate::store::RecordStore) (insert unless present, read,
//! compare-and-set on the `version` column, delete by version, the sweeper's candidates)
//! and [`Fenced`] runs the protocol over it. The takeover rule, which steps survive,
//! whether a release keeps a record and what operators see are the engine's
//! ([`crate::fenced::rules`]), as for every store on the seam.
//!
//! Round trips: a fresh key one (the insert) and its completion one; a replay, an
//! in-progress duplicate or a mismatch one (the insert answers the record it found); a
//! renewal and a step one each; a takeover two (the insert, then a compare-and-set); a
//! release two (a read, then a delete or a compare-and-set). A compare-and-set that finds
//! the record at another version adds a read.
//!
//! # One clock: the database's
//!
//! Every expiry and lease, and every timestamp written, is on the server's
//! `UTC_TIMESTAMP(6)`; TTL and lease travel as microseconds and the server computes
//! `UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND`. MySQL evaluates it once per statement.
//! Every answer carries the database's clock, which the engine judges the record on. UTC
//! and `DATETIME(6)`, not `NOW()` and `TIMESTAMP`: independent of the session's time zone
//! (an app's pool may set its own), no daylight-saving fold, no year-2038 limit.
//!
//! # Group commit: inserts and completions
//!
//! Concurrent inserts are batched into one request to the server, and so are concurrent
//! completions (`group_commit.rs`, on the batcher skeleton the SQL stores share): a batch
//! costs one round trip whatever its size. A request holds several statements, sent as
//! text with every value a hexadecimal or decimal literal (a prepared statement holds
//! only one): an insert is an `INSERT IGNORE` and the read of the record in one request,
//! so a fresh key and a replay are one round trip each. The batchers run on connections
//! of their own, taken from the pool and detached from it, so sqlx's ping of every
//! connection handed back to a pool (one more round trip per operation) never happens on
//! them. Every other operation is one plain prepared statement on the pool.
//!
//! Why not the alternatives for the insert: `INSERT … ON DUPLICATE KEY UPDATE` locks
//! (and with a conditional `SET`, writes) the row even when it changes nothing, so every
//! replay would be a write queued on that row. A `SELECT … FOR UPDATE` of a key that does
//! not exist yet takes a gap lock that does not exclude other gap locks: two first
//! requests both lock the gap, both insert, and deadlock. `INSERT … RETURNING` (MariaDB
//! only) names only the rows inserted.
//!
//! # Lock conflicts
//!
//! Under REPEATABLE READ an insert that finds a duplicate key takes a shared lock on the
//! existing row, and one of a key whose record was deleted locks the gap, so racing
//! inserts, updates and deletes can deadlock; InnoDB rolls one statement back (1213), or
//! one waited out `innodb_lock_wait_timeout` (1205). One rule (`lock_conflict.rs`) holds
//! for every write of the register outside a handler's transaction: it is sent again, a
//! few times at most. Sorting each insert batch by `scope_key_sha256` keeps concurrent
//! batches of different instances locking rows in one order.
//!
//! # Transactional handlers
//!
//! A `Tx<MySql>` handler's completion and atomic steps are the owner's compare-and-set on
//! its transaction's connection ([`Fenced::transactions`]): they commit or roll back with
//! the handler's writes, and a takeover that committed first makes them stale.
//!
//! # Recovery points: the `steps` column
//!
//! A record keeps the steps its handler completed in one nullable `LONGBLOB`, the
//! concatenation of `encode_step` in recording order (schema v2), appended with `CONCAT`.
//! Past the server's `max_allowed_packet`, `CONCAT` yields `NULL`, which outside strict
//! mode would be stored silently, dropping every step: the append refuses a step that
//! would not fit, and that is an error, not a lost record.
//!
//! # Keys: exact and of any length
//!
//! Scopes have no length limit and a key may be 255 characters: two `utf8mb4` columns
//! that long exceed what an InnoDB index holds. A record is therefore found by
//! `scope_key_sha256`, SHA-256 over the scope's byte length, the scope and the key
//! (length-prefixed, so scope `a:b` + key `c` differs from `a` + `b:c`), unique in its own
//! index. `scope` and `key` are stored as `BLOB`s beside it and every statement compares
//! them too, byte for byte: case and trailing spaces matter, as in every store.
//!
//! # Layout: rows in the order they were claimed
//!
//! InnoDB keeps a table's rows in the B-tree of its primary key. The primary key is an
//! `AUTO_INCREMENT` `id` (schema v3), not the key's hash: a new record goes to the end of
//! the table, the records of one day lie together and pages fill up, where hashes sent
//! each new record to a random page, split pages half full and, once the table outgrew
//! the buffer pool, made claims and replays wait for disk (`bench/scale` measures both).
//! The `id` is never an input: every statement finds a record by its hash. The insert
//! names its rows in a `VALUES` list, so InnoDB hands out their ids under a mutex rather
//! than the table lock an `INSERT … SELECT` would hold.
//!
//! # Migrations
//!
//! The schema (`migrations/mysql/`) is embedded in the binary and applied on connect,
//! recorded in `_idempotent_migrations` (not sqlx's `_sqlx_migrations`, so the store can
//! share a database with an app's own sqlx migrations). The store holds a named lock
//! (`GET_LOCK`, keyed by the database name) while it applies them, so instances starting
//! at once apply them one after the other; v1's DDL uses `IF NOT EXISTS` as well. v2's
//! `ADD COLUMN`, v3's `ALTER` and v4's (the `version` column, and the trigger that keeps
//! an earlier release's writes moving it during a rolling upgrade) cannot (MySQL 8 has no
//! `IF NOT EXISTS` there): DDL commits implicitly, so a migration that failed halfway
//! leaves its row in `_idempotent_migrations` unfinished, and the store refuses to open
//! until an operator checks the table and deletes that row. (Not sqlx's own migration lock: it asks for
//! `GET_LOCK(name, -1)`, which MariaDB answers at once without taking the lock.) v3
//! rebuilds the table and blocks writes to it while it copies the rows: upgrade a large
//! table in a quiet hour.
//!
//! # Durability
//!
//! A claim or completion is acknowledged once InnoDB committed it. It survives a server
//! crash with `innodb_flush_log_at_trx_commit = 1` (the default); with `2` or `0` the last
//! second of commits may be lost on an OS crash or power failure, and a retry of a lost
//! completion runs the handler again. With binary-log replication, `sync_binlog = 1` (the
//! default) keeps the binary log in step with InnoDB; asynchronous replicas may lag, so a
//! failover to one can lose acknowledged claims and completions (semi-synchronous
//! replication or Galera/Group Replication avoids that). Point every instance at the
//! primary: a claim read from a lagging replica could run a duplicate.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{ConnectOptions, Connection, MySql};

use super::sql::{self, EmbeddedMigration};
use super::{Capabilities, Forward, RecordStore, Store, StoreError, TxSupport};
use crate::fenced::Fenced;

mod completion;
mod group_commit;
mod insert;
mod lock_conflict;
mod records;

use records::MySqlRecords;

/// The embedded migrations, in version order; the files live in `migrations/mysql/`.
const MIGRATIONS: &[EmbeddedMigration] = &[
    EmbeddedMigration {
        version: 1,
        description: "idempotency records",
        sql: include_str!("../../../migrations/mysql/0001_idempotency_records.sql"),
    },
    EmbeddedMigration {
        version: 2,
        description: "recorded steps",
        sql: include_str!("../../../migrations/mysql/0002_recorded_steps.sql"),
    },
    EmbeddedMigration {
        version: 3,
        description: "time ordered rows",
        sql: include_str!("../../../migrations/mysql/0003_time_ordered_rows.sql"),
    },
    EmbeddedMigration {
        version: 4,
        description: "record versions",
        sql: include_str!("../../../migrations/mysql/0004_record_versions.sql"),
    },
];

/// How long a request waits for a pooled connection before it is answered `503`: while
/// the database is unreachable, requests fail fast instead of hanging for sqlx's default
/// 30 seconds.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long `connect` waits for the first connection before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// TTLs and leases are clamped to this (1000 years) so `UTC_TIMESTAMP(6) + INTERVAL`
/// stays inside what `DATETIME` can represent (up to year 9999).
const MAX_INTERVAL_MICROS: i64 = 1000 * 366 * 24 * 60 * 60 * 1_000_000;

/// A [`Store`] on MySQL 8 or MariaDB 10.6+: the store for many instances of an app
/// sharing one database (see the module docs for how each operation is atomic).
///
/// - **The database's clock.** Every expiry and lease decision and every timestamp uses
///   the server's `UTC_TIMESTAMP(6)`; instances' clocks may drift without effect.
/// - **Round trips.** Alone, a fresh request costs two (claim, complete), a replay, an
///   in-progress duplicate or a mismatch one (and writes nothing); a renewal and a step
///   one each; a takeover two; a release two. Every write is a compare-and-set on the
///   record's version; the protocol's decisions are the engine's. Concurrent claims
///   share one request, and so do concurrent completions (group commit): under load,
///   fewer per request. The batches run on two connections the store takes from the pool
///   and keeps, detached from it (so beyond its `max_connections`).
/// - **Migrations on connect**, embedded in the binary, serialised across instances by
///   a named lock (`GET_LOCK`), recorded in `_idempotent_migrations`.
/// - **Transactional handlers** (`Tx<MySql>`): the handler's writes and the completion
///   commit in one InnoDB transaction.
///
/// Cheap to clone (the pool and the batchers' queues are shared); clones share the
/// owners' versions.
///
/// ```no_run
/// # async fn demo() -> Result<(), idempotent_runtime::StoreError> {
/// use idempotent_runtime::store::MySqlStore;
///
/// // Its own pool, the table in the URL's database:
/// let store = MySqlStore::connect("mysql://app:secret@db:3306/payments").await?;
/// // Or sharing the app's pool:
/// let store = MySqlStore::from_pool(store.pool().clone()).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MySqlStore {
    /// The protocol over the table: a cheap clone shares the owners' versions.
    fenced: Arc<Fenced<MySqlRecords>>,
    /// Transactional handlers' writes, sharing those versions.
    transactions: TxSupport,
}

impl std::fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pool = &self.fenced.records().pool;
        f.debug_struct("MySqlStore")
            .field("location", &describe_options(&pool.connect_options()))
            .field("pool_size", &pool.size())
            .finish()
    }
}

impl MySqlStore {
    /// The table that records which of the embedded migrations were applied.
    pub const MIGRATIONS_TABLE: &str = "_idempotent_migrations";

    /// Connects to `url` (`mysql://user:password@host:port/database?…`) with a pool of
    /// its own and applies the embedded migrations; the table lives in the URL's
    /// database, which must exist.
    ///
    /// Fails with [`StoreError::Open`] — naming the URL with its password redacted — when
    /// the URL is invalid or the server cannot be reached within 10 seconds, and with
    /// [`StoreError::Migrate`] when the migrations fail.
    ///
    /// The pool uses sqlx's defaults (which include the session time zone `+00:00`; the
    /// store does not depend on it) except that connections are not pinged before each
    /// use (that would add a round trip to every operation) and a request waits at most
    /// 5 seconds for a connection. Build the pool yourself and use
    /// [`from_pool`](Self::from_pool) to choose otherwise.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let open_error = |reason: String| StoreError::Open {
            location: sql::redact_url(url),
            reason,
        };
        let options = MySqlConnectOptions::from_str(url).map_err(|e| open_error(e.to_string()))?;
        // A direct connection first: it fails fast with the real reason (the pool would
        // retry a refused connection until its acquire timeout), and runs the migrations.
        let mut conn = tokio::time::timeout(CONNECT_TIMEOUT, options.connect())
            .await
            .map_err(|_| {
                open_error(format!(
                    "no connection within {}s",
                    CONNECT_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| open_error(e.to_string()))?;
        migrate(&mut conn, sql::redact_url(url)).await?;
        // Closing only says goodbye politely; the migrations are already committed.
        let _ = conn.close().await;

        let pool = MySqlPoolOptions::new()
            .test_before_acquire(false)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(|e| open_error(e.to_string()))?;
        Ok(Self::with_pool(pool))
    }

    /// Uses an existing pool, e.g. the app's own, and applies the embedded migrations
    /// through it; the table lives in the pool's database.
    ///
    /// Migrations run on a connection that is closed afterwards rather than returned to
    /// the pool, so nothing they leave behind (a named lock of a failed run) leaks into
    /// the app's connections.
    pub async fn from_pool(pool: MySqlPool) -> Result<Self, StoreError> {
        let location = describe_options(&pool.connect_options());
        let mut conn = pool.acquire().await.map_err(|e| StoreError::Open {
            location: location.clone(),
            reason: e.to_string(),
        })?;
        conn.close_on_drop();
        migrate(&mut conn, location).await?;
        drop(conn);
        Ok(Self::with_pool(pool))
    }

    fn with_pool(pool: MySqlPool) -> Self {
        let fenced = Fenced::new(MySqlRecords::new(pool));
        let transactions = fenced.transactions::<MySql>();
        Self {
            fenced: Arc::new(fenced),
            transactions,
        }
    }

    /// The connection pool, to share with the app (its own queries, or the
    /// transactional unit of work).
    pub fn pool(&self) -> &MySqlPool {
        &self.fenced.records().pool
    }

    /// The record register under the store: what the protocol reads and writes, one
    /// statement per operation (see the module docs).
    pub fn records(&self) -> &impl RecordStore {
        self.fenced.records()
    }
}

/// How long a start waits for another instance's migrations to finish.
const MIGRATIONS_LOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// Applies the embedded migrations on `conn` under the store's own named lock (see
/// `sql/migrations_lock.sql` for why not sqlx's); `location` names the database in
/// errors.
///
/// Boxed with an explicit `Send` bound and through `Migrator::run_direct` (public,
/// doc-hidden), as in the Postgres store: `Migrator::run`'s `Acquire<'a>` bound makes
/// every future awaiting it fail to prove `Send`.
fn migrate(
    conn: &mut MySqlConnection,
    location: String,
) -> std::pin::Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + '_>> {
    Box::pin(async move {
        let held: Option<i64> = sqlx::query_scalar(include_str!("sql/migrations_lock.sql"))
            .bind(MIGRATIONS_LOCK_TIMEOUT.as_secs() as i64)
            .fetch_one(&mut *conn)
            .await?;
        if held != Some(1) {
            return Err(StoreError::Open {
                location,
                reason: format!(
                    "another instance held the migrations lock for {}s",
                    MIGRATIONS_LOCK_TIMEOUT.as_secs()
                ),
            });
        }
        let mut migrator = sql::migrator(MIGRATIONS, MySqlStore::MIGRATIONS_TABLE);
        migrator.set_locking(false);
        let applied = migrator.run_direct(None, &mut *conn, false).await;
        let released = sqlx::query(include_str!("sql/migrations_unlock.sql"))
            .execute(&mut *conn)
            .await;
        applied?;
        released?;
        Ok(())
    })
}

/// The record's unique `scope_key_sha256`: SHA-256 over the scope's byte length (8 bytes,
/// big-endian), the scope and the key — length-prefixed, so no two `(scope, key)` pairs
/// share an input.
fn scope_key_sha256(scope: &str, key: &str) -> Vec<u8> {
    let mut hasher = Sha256::new();
    hasher.update((scope.len() as u64).to_be_bytes());
    hasher.update(scope.as_bytes());
    hasher.update(key.as_bytes());
    hasher.finalize().to_vec()
}

/// A `Duration` as whole microseconds, clamped (see [`MAX_INTERVAL_MICROS`]).
fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros())
        .unwrap_or(i64::MAX)
        .min(MAX_INTERVAL_MICROS)
}

/// Every operation is the protocol's over the table ([`Fenced`]); the store adds the
/// transactional handlers, whose writes share the owners' versions.
impl Forward for MySqlStore {
    fn inner(&self) -> &dyn Store {
        &*self.fenced
    }

    fn capabilities(&self) -> Capabilities {
        self.fenced
            .capabilities()
            .with_transactions(self.transactions.clone())
    }
}

/// Where a pool connects, for error messages: `mysql://user@host:port/db`. Connect
/// options never reveal the password, so there is nothing to redact.
fn describe_options(options: &MySqlConnectOptions) -> String {
    let host = match options.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    };
    format!(
        "mysql://{}@{}/{}",
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
        sql::assert_embedded_migrations_match("mysql", MIGRATIONS);
    }

    #[test]
    fn clamps_intervals() {
        assert_eq!(micros(Duration::from_millis(1500)), 1_500_000);
        assert_eq!(micros(Duration::MAX), MAX_INTERVAL_MICROS);
    }

    #[test]
    fn record_ids_are_length_prefixed() {
        assert_ne!(scope_key_sha256("a:b", "c"), scope_key_sha256("a", "b:c"));
        assert_ne!(scope_key_sha256("a:", "bc"), scope_key_sha256("a", ":bc"));
        assert_ne!(scope_key_sha256("key", "k"), scope_key_sha256("Key", "k"));
        assert_eq!(scope_key_sha256("s", "k").len(), 32);
    }
}
