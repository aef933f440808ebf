//! [`MySqlStore`]: the store for many instances sharing one MySQL 8 or MariaDB 10.6+
//! database.
//!
//! Like `PostgresStore`, every instance of the app talks to the same
//! `idempotency_records` table, so a retry that lands on another instance still finds the
//! first attempt's claim or recorded response.
//!
//! # One clock: the database's
//!
//! Every expiry and lease decision and every timestamp written uses the server's
//! `UTC_TIMESTAMP(6)`; TTL and lease travel as microseconds and the server computes
//! `UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND`. MySQL evaluates it once per statement,
//! so a statement's decision and the times it writes agree. UTC and `DATETIME(6)`, not
//! `NOW()` and `TIMESTAMP`: independent of the session's time zone (an app's pool may set
//! its own), no daylight-saving fold, no year-2038 limit.
//!
//! # Group commit: a claim and a completion, one round trip each
//!
//! Concurrent claims are batched into one request to the server, and so are concurrent
//! completions (`group_commit.rs`, on the batcher skeleton the SQL stores share): a batch
//! costs one round trip whatever its size, so under load a fresh key costs well under
//! two, and alone exactly two (claim, complete). A request holds several statements,
//! sent as text with every value a hexadecimal or decimal literal (a prepared statement
//! holds only one). The batchers run on connections of their own, taken from the pool and
//! detached from it, so sqlx's ping of every connection handed back to a pool (one more
//! round trip per operation) never happens on them.
//!
//! # The claim: insert what is new, then read back, no transaction
//!
//! A batch of claims is two autocommitted statements in one request
//! (`sql/claim_batch.sql`), each on the database clock:
//!
//! 1. `INSERT IGNORE` every claim's in-progress record (one multi-row `VALUES` statement,
//!    rows in `scope_key_sha256` order). A key with a record already is skipped: no
//!    record is written, no error. (InnoDB inserts a row into the clustered index before
//!    it checks a unique secondary one, so it inserts the duplicate and takes it back in
//!    the same statement: a few hundred bytes of redo log, no commit to disk.)
//! 2. A consistent (non-locking) read of every claim's record. A record holding the
//!    claim's token is its own: claimed. Any other is classified by the shared takeover
//!    rule — replay, in progress (`Retry-After` from the lease left) or mismatch —
//!    answered by this same round trip, without writing anything. A key twice in one
//!    batch is therefore decided as if the claims ran one after the other: the first
//!    inserts, the second finds its record in progress.
//! 3. Only if the rule allows a takeover: an `UPDATE … WHERE <that reason still holds>`
//!    (`sql/take_over_*.sql`), a request of its own. InnoDB evaluates an `UPDATE`'s
//!    condition on the newest committed row under its exclusive lock, so of any number
//!    of racing retries exactly one matches; the others match nothing and claim again
//!    (and then find the winner's record). A record gone between the insert and the read
//!    (released or purged) makes the claim run again too. A takeover of an expired record
//!    clears its steps; one of a lost lease keeps them and answers with them, read in the
//!    same request by a second statement filtered by the new token, after the `UPDATE`
//!    committed (MySQL has no `UPDATE … RETURNING`): the steps as the takeover left them,
//!    never those of the batch's read, which may predate a step the old owner committed
//!    while the `UPDATE` waited for the row.
//!
//! The batch's read never ships the `steps` column: a claim that does not take over has
//! no use for them, so keys without steps cost what they did before steps existed.
//!
//! Why not the alternatives: `INSERT … ON DUPLICATE KEY UPDATE` locks exclusively (and
//! with a conditional `SET`, writes) the row even when it refuses the claim, so every
//! replay and `409` would be a write queued on that row, and its affected-rows count
//! cannot tell a fresh insert from a refused one under sqlx's `CLIENT_FOUND_ROWS`; the
//! reason of a takeover would be lost too. A `SELECT … FOR UPDATE` of a key that does not
//! exist yet takes a gap lock that does not exclude other gap locks: two first requests
//! both lock the gap, both insert, and deadlock — on every race for a fresh key.
//! `INSERT … RETURNING` (MariaDB only; MySQL has none) names only the rows inserted, so
//! the read of the others would still be needed. `INSERT IGNORE` turns a value too long
//! for its column into a warning and stores it cut short, so the claim refuses a scope or
//! key longer than its `BLOB` column before sending it.
//!
//! Under REPEATABLE READ an insert that finds a duplicate key takes a shared lock on the
//! existing row for the statement, so a replay briefly waits for a completion of the same
//! row to commit, and racing batches and releases can deadlock; InnoDB then rolls one
//! statement back (error 1213), and its claims, like those of one that waited out
//! `innodb_lock_wait_timeout` (1205), simply run again — contention, answered `409` if it
//! persists, never an error. Sorting each batch by `scope_key_sha256` keeps concurrent
//! batches of different instances locking rows in one order. READ COMMITTED would not
//! change this: InnoDB keeps the gap lock of a duplicate-key check at that level too, the
//! read is a consistent read at either, and the completions' `UPDATE`s find their rows
//! by the unique `scope_key_sha256` (a record lock, no gap); the connections keep the
//! server's level.
//!
//! # Completions, and everything else
//!
//! A batch of completions is one transaction of fenced `UPDATE`s
//! (`sql/complete_batch.sql`, each `sql/complete.sql` fenced by `token = ? AND state =
//! 'in_progress'`, by `scope_key_sha256`), whose per-statement counts say which still
//! owned their claim; one commit for the batch. A response larger than a batch's bytes
//! runs alone as a prepared statement on the pool. Every completion clears the record's
//! steps (the response replaces them). `renew` is a single prepared statement on the
//! pool, fenced the same way. `release` is one request of two fenced statements
//! (`sql/release.sql`): a `DELETE` of the record if it holds no steps, else an `UPDATE`
//! that keeps it in progress with its lease ended now and its token
//! `FencingToken::RELEASED`, so the same request resumes by a lease-lost takeover. Any
//! of these fenced writes can deadlock with a claim batch's duplicate-key checks (and
//! so can `record_step` and `forget`'s `DELETE`): one rule, in `lock_conflict.rs`,
//! sends a write InnoDB rolled back for a lock conflict again, a few times at most.
//! `purge_expired` reads a batch of expired records' ids without locking, then deletes
//! those rows by primary key, re-checking their expiry: no range of the expiry index is
//! ever locked, so sweepers on many instances never make claims wait. The operator
//! tools: `inspect` is one consistent read (an in-progress record's steps included);
//! `forget` is that read, then a `DELETE` by `scope_key_sha256` fenced by the token and
//! state it read (run again if the record changed between), which deletes the steps
//! with the record.
//!
//! # Recovery points: the `steps` column
//!
//! A record keeps the steps its handler completed in one nullable `LONGBLOB`, the
//! concatenation of `encode_step` in recording order (schema v2, added in place to a v1
//! table). `record_step` is one prepared `UPDATE` (`sql/record_step.sql`) fenced like a
//! completion, appending with `CONCAT`, on the pool or, for a transactional handler, on
//! its transaction. Past the server's `max_allowed_packet`, `CONCAT` yields `NULL`, which
//! outside strict mode would be stored silently, dropping every step: the `UPDATE` refuses
//! a step that would not fit, and only when it matched nothing a read says whether the
//! token lost the record (`Ok(false)`) or the step was too large (an error).
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
//! The `id` is never an input: every statement finds a record by its hash, and only the
//! sweeper deletes by `id`. The claim inserts with a `VALUES` list, so InnoDB hands out
//! its ids under a mutex rather than the table lock an `INSERT … SELECT` would hold.
//!
//! # Migrations
//!
//! The schema (`migrations/mysql/`) is embedded in the binary and applied on connect,
//! recorded in `_idempotent_migrations` (not sqlx's `_sqlx_migrations`, so the store can
//! share a database with an app's own sqlx migrations). The store holds a named lock
//! (`GET_LOCK`, keyed by the database name) while it applies them, so instances starting
//! at once apply them one after the other; v1's DDL uses `IF NOT EXISTS` as well. v2's
//! `ADD COLUMN` and v3's `ALTER` cannot (MySQL 8 has no `IF NOT EXISTS` there): DDL commits
//! implicitly, so a migration that failed halfway leaves its row in
//! `_idempotent_migrations` unfinished, and the store refuses to open until an operator
//! checks the table and deletes that row. (Not sqlx's own migration lock: it asks for
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
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Row};

use super::sql::operator::OperatorStatements;
use super::sql::{self, CompletionColumns, EmbeddedMigration};
use super::{
    Capabilities, ClaimAnswer, ClaimRequest, FencingToken, ForgetOutcome, RecordInfo, RecordedStep,
    Store, StoreError, StoredResponse, TxSupport,
};

mod claim;
mod completion;
mod group_commit;
mod lock_conflict;
mod operator;
mod transaction;

use claim::QueuedClaim;
use completion::QueuedCompletion;
use group_commit::{Batcher, Value, inline};
use lock_conflict::resend_on_lock_conflict;

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
];

const RENEW: &str = include_str!("sql/renew.sql");
/// The fenced completion: run alone (prepared), in a handler's transaction, or inlined
/// into a batch (`completion.rs`).
const COMPLETE: &str = include_str!("sql/complete.sql");
const RELEASE: &str = include_str!("sql/release.sql");
/// The fenced append of one step: on the pool, or in a handler's transaction.
const RECORD_STEP: &str = include_str!("sql/record_step.sql");
/// Why [`RECORD_STEP`] matched nothing, read only when it did.
const RECORD_STEP_REFUSED: &str = include_str!("sql/record_step_refused.sql");
const PURGE_FIND: &str = include_str!("sql/purge_find.sql");
const PURGE_DELETE: &str = include_str!("sql/purge_delete.sql");

/// How many records one purge `DELETE` names (its `IN` list).
const PURGE_CHUNK: usize = 500;

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
/// - **Round trips.** Concurrent claims share one request, and so do concurrent
///   completions (group commit): alone, a fresh request costs two round trips (claim,
///   complete), a replay, an in-progress duplicate or a mismatch one (and writes
///   nothing); a takeover adds one request (its fenced `UPDATE`, with the read of the
///   steps a lost lease kept), and recording a step costs one. Under load, fewer per
///   request. The batches run on two connections the store takes from the pool and
///   keeps, detached from it (so beyond its `max_connections`).
/// - **Migrations on connect**, embedded in the binary, serialised across instances by
///   a named lock (`GET_LOCK`), recorded in `_idempotent_migrations`.
/// - **Transactional handlers** (`Tx<MySql>`): the handler's writes and the completion
///   commit in one InnoDB transaction.
///
/// Cheap to clone (the pool and the batchers' queues are shared).
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
    pool: MySqlPool,
    transactions: TxSupport,
    /// Batches concurrent claims into one request (`group_commit.rs`).
    claims: Batcher<QueuedClaim>,
    /// Batches concurrent completions into one request and transaction.
    completions: Batcher<QueuedCompletion>,
}

impl std::fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlStore")
            .field("location", &describe_options(&self.pool.connect_options()))
            .field("pool_size", &self.pool.size())
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
        let transactions = transaction::support(pool.clone());
        let claims = group_commit::start(pool.clone());
        let completions = group_commit::start(pool.clone());
        Self {
            pool,
            transactions,
            claims,
            completions,
        }
    }

    /// The connection pool, to share with the app (its own queries, or the
    /// transactional unit of work).
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
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

/// Sends the release request (`sql/release.sql`) once: whether the token owned the record.
/// The statements autocommit one by one, so a `DELETE` that matched has released the
/// record even if the `UPDATE` after it then fails.
async fn release_once(pool: &MySqlPool, statements: &str) -> Result<bool, sqlx::Error> {
    let mut results = sqlx::raw_sql(AssertSqlSafe(statements.to_owned())).fetch_many(pool);
    // Rows matched per statement: the DELETE's, then the UPDATE's; at most one matches.
    let mut matched = 0;
    while let Some(result) = results.next().await {
        match result {
            Ok(result) => matched += result.left().map_or(0, |done| done.rows_affected()),
            Err(_) if matched == 1 => return Ok(true),
            Err(error) => return Err(error),
        }
    }
    Ok(matched == 1)
}

/// A `Duration` as whole microseconds, clamped (see [`MAX_INTERVAL_MICROS`]).
fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros())
        .unwrap_or(i64::MAX)
        .min(MAX_INTERVAL_MICROS)
}

/// A statement of the record `(scope, key)` fenced by `token`: the parameters `renew`,
/// `complete` and `release` end with.
fn bind_record_token<'q>(
    query: sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments>,
    scope: &str,
    key: &str,
    token: FencingToken,
) -> sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments> {
    query
        .bind(scope_key_sha256(scope, key))
        .bind(scope.to_owned())
        .bind(key.to_owned())
        .bind(token.0)
}

/// The completion statement with its parameters, on the pool or in a handler's
/// transaction.
fn completion<'q>(
    scope: &str,
    key: &str,
    token: FencingToken,
    response: &'q StoredResponse,
) -> Result<sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments>, StoreError> {
    let columns = CompletionColumns::of(response)?;
    let query = sqlx::query(COMPLETE)
        .bind(columns.status)
        .bind(columns.headers)
        .bind(columns.body);
    Ok(bind_record_token(query, scope, key, token))
}

/// `sql/record_step.sql` with its parameters: appends `encoded` (one
/// [`encode_step`](super::encode_step)) to the steps of the claim `token` holds.
fn record_step_statement<'q>(
    scope: &str,
    key: &str,
    token: FencingToken,
    encoded: &'q [u8],
) -> sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments> {
    let query = bind_record_token(sqlx::query(RECORD_STEP).bind(encoded), scope, key, token);
    query.bind(i64::try_from(encoded.len()).unwrap_or(i64::MAX))
}

/// `sql/record_step_refused.sql`: whether `token` still holds the record that
/// [`record_step_statement`] did not append to.
fn record_step_refused_statement(
    scope: &str,
    key: &str,
    token: FencingToken,
) -> sqlx::query::Query<'static, sqlx::MySql, sqlx::mysql::MySqlArguments> {
    bind_record_token(sqlx::query(RECORD_STEP_REFUSED), scope, key, token)
}

/// `record_step`'s answer once its append matched nothing, from the row
/// [`record_step_refused_statement`] read: no row, the token owns nothing (`Ok(false)`);
/// a row, the token holds the record but the step would take its steps past the
/// server's `max_allowed_packet`, which is an error, not a lost claim.
fn step_refused(row: Option<sqlx::mysql::MySqlRow>, step_bytes: usize) -> Result<bool, StoreError> {
    let Some(row) = row else {
        return Ok(false);
    };
    let held: i64 = row.try_get("steps_bytes")?;
    let limit: i64 = row.try_get("max_allowed_packet")?;
    Err(StoreError::backend(format!(
        "a step of {step_bytes} bytes would take the record's {held} bytes of steps past \
         the server's max_allowed_packet ({limit} bytes)"
    )))
}

#[async_trait]
impl Store for MySqlStore {
    async fn record_step(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        step: &RecordedStep,
    ) -> Result<bool, StoreError> {
        let encoded = super::encode_step(step);
        let done = resend_on_lock_conflict("record_step", || {
            record_step_statement(scope, key, token, &encoded).execute(&self.pool)
        })
        .await?;
        if done.rows_affected() == 1 {
            return Ok(true);
        }
        let row = record_step_refused_statement(scope, key, token)
            .fetch_optional(&self.pool)
            .await?;
        step_refused(row, encoded.len())
    }

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
        // Rows *matched* (sqlx connects with CLIENT_FOUND_ROWS): a renew that happens to
        // write the same lease end still counts as owning the record.
        let done = resend_on_lock_conflict("renew", || {
            let query = sqlx::query(RENEW).bind(micros(lease)).bind(micros(ttl));
            bind_record_token(query, scope, key, token).execute(&self.pool)
        })
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
        match QueuedCompletion::batchable((scope, key), token, response)? {
            // The batcher sends a batch again itself (`group_commit.rs`).
            Some(completion) => self.completions.ask(completion).await,
            None => {
                let pool = &self.pool;
                let done = resend_on_lock_conflict("complete", move || async move {
                    let query = completion(scope, key, token, response)?;
                    Ok::<_, StoreError>(query.execute(pool).await?)
                })
                .await?;
                Ok(done.rows_affected() == 1)
            }
        }
    }

    async fn release(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        let id = scope_key_sha256(scope, key);
        let record = [
            Value::Bytes(&id),
            Value::Bytes(scope.as_bytes()),
            Value::Bytes(key.as_bytes()),
            Value::Int(token.0),
        ];
        let released = [Value::Int(FencingToken::RELEASED.0)];
        let statements = inline(RELEASE, &[&record[..], &released, &record].concat());
        Ok(resend_on_lock_conflict("release", || release_once(&self.pool, &statements)).await?)
    }

    async fn purge_expired(&self, limit: u32) -> Result<u64, StoreError> {
        if limit == 0 {
            return Ok(0);
        }
        let ids: Vec<u64> = sqlx::query(PURGE_FIND)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()?;
        let mut deleted = 0;
        for chunk in ids.chunks(PURGE_CHUNK) {
            let placeholders = vec!["?"; chunk.len()].join(", ");
            let statement = AssertSqlSafe(PURGE_DELETE.replace("{ids}", &placeholders));
            let mut query = sqlx::query(statement);
            for id in chunk {
                query = query.bind(id);
            }
            deleted += query.execute(&self.pool).await?.rows_affected();
        }
        Ok(deleted)
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
        // Read and fenced delete again: the read decides anew on what is there now.
        resend_on_lock_conflict("forget", || self.forget_record(scope, key, force)).await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none().with_transactions(self.transactions.clone())
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
