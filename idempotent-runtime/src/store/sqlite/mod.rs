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
//! - The schema (`migrations/sqlite/`) is embedded in the binary and applied
//!   on open, recorded in its own [`SqliteStore::MIGRATIONS_TABLE`] so it never collides
//!   with an app's own `sqlx` migrations in the same database.
//! - Times are INTEGER milliseconds from the store's [`Clock`] (the system clock unless
//!   one is injected), never SQLite's `now`, so every decision of one store uses one
//!   clock. **TTLs are wall-clock time** (users read them as calendar time; a wall step
//!   moves them). **Leases are judged on the host's monotonic clock**, which a wall step
//!   cannot move and every process sharing the file reads alike: on Linux
//!   `CLOCK_BOOTTIME`, stored with the kernel's boot id, and a lease written in another
//!   boot has run out. A clock with no boot id (other systems) leaves leases on the wall
//!   clock, exposed to its steps. See `lease_time.rs`.
//! - **The protocol is the engine's** ([`Fenced`](crate::fenced::Fenced)): the table is a
//!   register of records (`records.rs`) that inserts a record unless the key has one,
//!   reads one, changes one only at the version its caller read (every write bumps
//!   `version`, migration 0004) and deletes by version. Which claim takes a record over,
//!   which steps survive, whether a release keeps the record and what the sweeper deletes
//!   are decided once, in Rust, for every store. An insert reads first: a replay, `409`
//!   or `422` is answered from that plain read and never takes SQLite's one write lock.
//!   A write that changed nothing reads the record back in the same call, so a duplicate
//!   that raced the read or a stale compare-and-set costs no second trip.
//! - **Recorded steps** (recovery points, `store/steps.rs`) are one `steps` BLOB column
//!   of the record (migration 0003; NULL: none, and only an in-progress record holds
//!   any), appended with `||` and cast back to a BLOB so the bytes stay as they are
//!   (outputs hold NUL and 0xFF).
//! - **Group commit.** Every write of the store (claims' inserts and takeovers,
//!   renewals, recorded steps, completions, releases, purges) goes through one writer task, which runs
//!   the writes waiting (a bounded batch) in one `BEGIN IMMEDIATE … COMMIT` and answers
//!   each only after the commit: one transaction (one WAL commit, one fsync at
//!   `synchronous = FULL`) for many requests, and no queue of connections polling for
//!   the write lock. Each write is still its single statement, in arrival order, so
//!   every compare-and-set is the same as in one transaction each; a
//!   statement that fails (a constraint) fails only its own caller; a transaction that
//!   fails as a whole fails every write in it, none is answered as done. Reads (every
//!   replay, `409`, `422`) never queue behind the writer. See `group_commit.rs`.
//!   A purge is the one long write: it is cut into writes of a hundred records,
//!   each followed by a wait as long as it took, so a sweep of a large backlog takes at
//!   most half of the writer's time and holds it a few milliseconds at a time.
//! - **A held write lock does not cost a live owner its lease.** A transactional
//!   handler (or another process) holding SQLite's write lock stalls the writer, and
//!   renewals time out in the engine after a third of their lease. The writer still
//!   runs every renewal that reached it, before the other writes of its batch
//!   (`group_commit.rs`, the renewal rule), and the protocol carries each renewal to its
//!   end though the engine stopped waiting for it, so a retry's takeover queued behind
//!   the same lock meets the owner's latest renewal, and its compare-and-set is stale. This holds
//!   for the requests of one store. A store in another process on the same file has its
//!   own writer, which may win the lock first when it frees; for that case a
//!   transactional handler holds the lock at most
//!   [`DEFAULT_MAX_TRANSACTION_HOLD`](SqliteStore::DEFAULT_MAX_TRANSACTION_HOLD) (5 s;
//!   [`with_max_transaction_hold`](SqliteStore::with_max_transaction_hold)), and every
//!   lease of every process sharing the file must be at least three times that hold: a
//!   lease renewed just before the lock was taken then outlives the hold.
//! - **Group read.** The reads of records are batched the same way by one reader task, a
//!   batch in one read transaction: one snapshot and one set of WAL locks for many reads
//!   (`group_read.rs`). The writer and the reader each run every batch on a connection of
//!   their own, in one call on its C handle on Tokio's blocking pool, not statement by
//!   statement through sqlx's connection thread (`dedicated.rs`, `raw_connection.rs`).
//! - **Checkpoints are SQLite's own.** The commit that takes the WAL past 1,000 pages
//!   copies it back into the database file. A task of their own, off the writer's
//!   commits, measured slower on the mix of fresh keys and retries
//!   (`bench/http/README.md`).

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::sql::{self, EmbeddedMigration};
use super::{Capabilities, Forward, RecordStore, Store, StoreError, TxSupport};
use crate::clock::{Clock, SystemClock};
use crate::fenced::Fenced;
use records::SqliteRecords;

mod dedicated;
mod group_commit;
mod group_read;
mod lease_time;
mod raw_connection;
mod records;
mod writers;

#[doc(hidden)]
pub use group_commit::{GroupCommitStats, WriteKind};

/// The embedded migrations, in order; the files live in `migrations/sqlite/`.
const MIGRATIONS: &[EmbeddedMigration] = &[
    EmbeddedMigration {
        version: 1,
        description: "create idempotency records",
        sql: include_str!("../../../migrations/sqlite/0001_create_idempotency_records.sql"),
    },
    EmbeddedMigration {
        version: 2,
        description: "lease on the boot clock",
        sql: include_str!("../../../migrations/sqlite/0002_lease_on_the_boot_clock.sql"),
    },
    EmbeddedMigration {
        version: 3,
        description: "recorded steps",
        sql: include_str!("../../../migrations/sqlite/0003_recorded_steps.sql"),
    },
    EmbeddedMigration {
        version: 4,
        description: "record versions",
        sql: include_str!("../../../migrations/sqlite/0004_record_versions.sql"),
    },
];

/// How often opening tries to apply the migrations. Two processes (or pools) opening one
/// fresh file at the same moment both try; the loser fails (its bookkeeping insert is a
/// duplicate, or its transaction is busy) and its next attempt finds nothing to do.
const MIGRATION_ATTEMPTS: u32 = 10;

/// How often opening retries a first connection refused as busy (see
/// [`SqliteStore::connect_with_clock`]).
const OPEN_ATTEMPTS: u32 = 10;

/// A [`Store`] in an SQLite database file: the single-host embedded default (see the
/// module docs).
///
/// Cheap to clone; clones share the pool, the one writer that group-commits every write
/// and the one reader that batches the claims' reads. Both are tasks on the Tokio runtime
/// the store is opened in (open it in the runtime that serves requests); they stop when
/// the last clone is dropped.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// The protocol over the table: a clone shares the owners' versions.
    fenced: Fenced<SqliteRecords>,
    /// Transactional handlers' writes, sharing those versions.
    transactions: TxSupport,
}

impl SqliteStore {
    /// Connections in the pool [`connect`](Self::connect) creates. The store's writer and its
    /// reader of claims each take one connection out of the pool for themselves on first
    /// use, and the pool may open replacements: the store holds at most two connections
    /// more than its pool's size (the same goes for a pool given to
    /// [`from_pool`](Self::from_pool)).
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
    /// forgets everything once the store (its writer and reader hold connections of
    /// their own) and the pool's connections are closed; prefer
    /// [`MemoryStore`](crate::store::MemoryStore) for that.
    ///
    /// # Errors
    ///
    /// [`StoreError::Open`] naming `url_or_path` when the file cannot be opened or
    /// created (missing directory, no permission, not a database) or the schema cannot
    /// be applied.
    pub async fn connect(url_or_path: &str) -> Result<Self, StoreError> {
        Self::connect_with_clock(url_or_path, Arc::new(SystemClock)).await
    }

    /// Like [`connect`](Self::connect), with every expiry and lease decision taken on
    /// `clock` (tests pass a [`ManualClock`](crate::clock::ManualClock)): TTLs on its
    /// wall time, leases on its monotonic time when it has a
    /// [`boot_id`](Clock::boot_id), else on its wall time. Every process sharing the
    /// file must judge leases on the same clock.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    pub async fn connect_with_clock(
        url_or_path: &str,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        let options = Self::connect_options(url_or_path)?;
        // Processes opening one fresh file together race to switch it to WAL; the loser's
        // first connection is refused as busy at once (no busy handler applies), so it
        // waits a moment and tries again.
        let mut attempt = 1;
        let pool = loop {
            let connected = Self::pool_options().connect_with(options.clone()).await;
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
        Ok(Self::with_parts(pool, clock))
    }

    /// The pool options [`connect`](Self::connect) uses:
    /// [`DEFAULT_MAX_CONNECTIONS`](Self::DEFAULT_MAX_CONNECTIONS), and no ping before
    /// each acquire. A SQLite connection is a file handle served by a thread of this
    /// process, not a socket that can die while idle; sqlx's default ping would only add
    /// a hop to that thread on every read. Start from them to build a pool for
    /// [`from_pool`](Self::from_pool).
    pub fn pool_options() -> SqlitePoolOptions {
        SqlitePoolOptions::new()
            .max_connections(Self::DEFAULT_MAX_CONNECTIONS)
            .test_before_acquire(false)
    }

    /// The connect options [`connect`](Self::connect) uses for `url_or_path` (a file path or a
    /// `sqlite:` URL): create the file if missing, WAL journal, `synchronous = FULL`
    /// (every commit is on disk before it is answered, so a claim or a completion
    /// survives a power loss or an OS crash; each of the writer's batches costs one
    /// fsync) and a [`DEFAULT_BUSY_TIMEOUT`](Self::DEFAULT_BUSY_TIMEOUT). Build your own
    /// pool from them to share it between the store ([`from_pool`](Self::from_pool)) and
    /// the rest of the app; `.synchronous(SqliteSynchronous::Normal)` on them trades the
    /// last commits before a power loss for write speed.
    ///
    /// # Errors
    ///
    /// [`StoreError::Open`] when `url_or_path` is a malformed `sqlite:` URL.
    pub fn connect_options(url_or_path: &str) -> Result<SqliteConnectOptions, StoreError> {
        let options = if is_url(url_or_path) {
            SqliteConnectOptions::from_str(url_or_path).map_err(|e| open_error(url_or_path, e))?
        } else {
            // A plain path is taken literally: no URL decoding of `%` or `?`.
            SqliteConnectOptions::new().filename(Path::new(url_or_path))
        };
        Ok(options
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Self::DEFAULT_BUSY_TIMEOUT))
    }

    /// A store on a pool the app already has (so the store and the app share
    /// connections), on the system clock; applies the embedded migrations.
    ///
    /// The pool's options are the caller's: give its connections a busy timeout (sqlx's
    /// default is 5s) and preferably WAL mode — [`connect_options`](Self::connect_options)
    /// has both.
    ///
    /// # Errors
    ///
    /// [`StoreError::Migrate`] when the schema cannot be applied.
    pub async fn from_pool(pool: SqlitePool) -> Result<Self, StoreError> {
        Self::from_pool_with_clock(pool, Arc::new(SystemClock)).await
    }

    /// Like [`from_pool`](Self::from_pool), on `clock` (as
    /// [`connect_with_clock`](Self::connect_with_clock)).
    ///
    /// # Errors
    ///
    /// As [`from_pool`](Self::from_pool).
    pub async fn from_pool_with_clock(
        pool: SqlitePool,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        migrate(&pool).await?;
        Ok(Self::with_parts(pool, clock))
    }

    fn with_parts(pool: SqlitePool, clock: Arc<dyn Clock>) -> Self {
        Self::over(SqliteRecords::start(
            pool,
            clock,
            Self::DEFAULT_MAX_TRANSACTION_HOLD,
        ))
    }

    fn over(records: SqliteRecords) -> Self {
        let fenced = Fenced::new(records);
        let transactions = fenced.transactions::<sqlx::Sqlite>();
        Self {
            fenced,
            transactions,
        }
    }

    /// How long a transactional handler (`Tx<Sqlite>`) may hold its transaction — and
    /// with it SQLite's one write lock — at most, unless set otherwise
    /// ([`with_max_transaction_hold`](Self::with_max_transaction_hold)): as long as
    /// other writers wait for the lock ([`DEFAULT_BUSY_TIMEOUT`](Self::DEFAULT_BUSY_TIMEOUT)).
    pub const DEFAULT_MAX_TRANSACTION_HOLD: Duration = Duration::from_secs(5);

    /// Bounds how long a transactional handler may hold its transaction, from its
    /// `BEGIN IMMEDIATE` to the end of its work; past it the handler is dropped, its
    /// writes roll back, its claim is released and it answers `500` as at its maximum
    /// duration. While a transaction holds the write lock no renewal of any process on
    /// the file commits: keep every lease of every process sharing the file at least
    /// three times this hold, so that a lease renewed just before the lock was taken
    /// outlives it. Set it before cloning the store (clones made before keep the hold
    /// they had).
    #[must_use]
    pub fn with_max_transaction_hold(self, hold: Duration) -> Self {
        let mut records = self.fenced.records().clone();
        records.max_hold = hold;
        Self::over(records)
    }

    /// The group-commit writer's counters so far (tests and diagnostics; not a stable
    /// API).
    #[doc(hidden)]
    pub fn group_commit_stats(&self) -> GroupCommitStats {
        self.fenced.records().writer.stats()
    }

    /// The connection pool, to share with the rest of the app.
    pub fn pool(&self) -> &SqlitePool {
        &self.fenced.records().pool
    }

    /// The record register under the store: what the protocol reads and writes, one
    /// statement per operation (see the module docs).
    pub fn records(&self) -> &impl RecordStore {
        self.fenced.records()
    }

    /// The embedded migrations as a [`Migrator`] recording into
    /// [`MIGRATIONS_TABLE`](Self::MIGRATIONS_TABLE);
    /// [`connect`](Self::connect) and [`from_pool`](Self::from_pool) run it.
    pub fn migrator() -> Migrator {
        sql::migrator(MIGRATIONS, Self::MIGRATIONS_TABLE)
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

/// Names what failed to open: a path as given, a `sqlite:` URL with any password
/// redacted (an encryption extension may take one as a parameter).
fn open_error(url_or_path: &str, reason: impl std::fmt::Display) -> StoreError {
    let location = if is_url(url_or_path) {
        sql::redact_url(url_or_path)
    } else {
        url_or_path.to_owned()
    };
    StoreError::Open {
        location,
        reason: reason.to_string(),
    }
}

fn is_url(url_or_path: &str) -> bool {
    url_or_path.starts_with("sqlite:")
}

/// Every operation is the protocol's over the table ([`Fenced`]); the store adds the
/// transactional handlers, whose writes share the owners' versions.
impl Forward for SqliteStore {
    fn inner(&self) -> &dyn Store {
        &self.fenced
    }

    fn capabilities(&self) -> Capabilities {
        self.fenced
            .capabilities()
            .with_transactions(self.transactions.clone())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn pool_options_skip_the_ping_before_acquire() {
        let options = super::SqliteStore::pool_options();
        assert!(!options.get_test_before_acquire());
        assert_eq!(
            options.get_max_connections(),
            super::SqliteStore::DEFAULT_MAX_CONNECTIONS
        );
    }

    #[test]
    fn embeds_every_migration_file() {
        super::sql::assert_embedded_migrations_match("sqlite", super::MIGRATIONS);
    }
}
