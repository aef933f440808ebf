//! Group commit: the store's writes — claims, renewals, recorded steps, completions,
//! releases, purges — batched into shared write transactions by one writer task.
//!
//! SQLite has one writer at a time. With every request writing on its own pooled
//! connection, each write is a transaction of its own (a WAL commit, and at
//! `synchronous = FULL` an fsync), and the connections queue for the write lock in
//! SQLite's busy handler, which polls with sleeps. Here a caller sends its write (one
//! statement) with a reply channel to the store's writer; the writer takes every write
//! waiting, up to [`MAX_BATCH`](batcher::MAX_BATCH), runs them in order in one
//! `BEGIN IMMEDIATE … COMMIT`, and answers each caller only after `COMMIT` returned.
//! While one batch commits, the next one gathers, and before taking it the writer lets
//! the requests already running add their writes (the batcher skeleton's gather,
//! `store/sql/batcher.rs`): the batch grows with the load, with no added wait when there
//! is none. What it buys: one transaction (one WAL commit, one fsync at
//! `synchronous = FULL`) for many requests, and no queue of connections polling for the
//! write lock.
//!
//! What every write keeps:
//!
//! - **Durable before answered.** A claim is committed before its handler runs, a
//!   completion before its response is sent: the reply follows `COMMIT`.
//! - **The same decisions.** Each write is the single statement it was before group
//!   commit, with the same parameters (the claim's "now" is still taken before its
//!   read), run in queue order: writes on one key in one batch see each other's effects
//!   exactly as they would one transaction after another. Fencing is the statements'
//!   `WHERE token = ?`, unchanged.
//! - **A failing write fails alone.** A statement refused by a constraint undoes only
//!   itself — SQLite's statement atomicity — and the transaction goes on; its caller gets
//!   the error, the others commit. Any other failure of a statement (an I/O error, a full
//!   disk: SQLite may have rolled the whole transaction back) rolls the batch back, and,
//!   as when `BEGIN` or `COMMIT` fails, every write of the batch gets an error (a write
//!   that failed on its own keeps its own). No write is ever answered as done unless its
//!   transaction committed.
//! - **Alone, no transaction.** A batch of one write runs its statement in autocommit,
//!   committed before it returns, as without group commit.
//! - **Bounded.** [`MAX_BATCH`](batcher::MAX_BATCH) writes per transaction,
//!   [`QUEUE`](batcher::QUEUE) waiting; a caller finding the queue full waits for room
//!   (and for the engine's store timeout). A write whose caller gave up before its batch
//!   began is not run — except a renewal.
//! - **Renewals are never dropped, and go first** (`renewals_first`). A write lock held
//!   elsewhere (a transactional handler, another process) stalls the batch, and the
//!   renewals queued behind it time out in their callers after a third of their lease.
//!   Dropped, the lease would run out in the store under a live handler, and a retry's
//!   takeover queued behind the same lock would commit the moment it frees. So a renewal
//!   that reached the writer is applied, before the other writes of its batch: a
//!   takeover is judged on the lease of the owner's last renewal sent before it. This
//!   holds within one store; a store in another process sharing the file races its own
//!   writes for the lock, see the module docs of `SqliteStore`.
//!
//! The writer is a task with a connection of its own (`dedicated.rs`): each batch runs
//! in a single call on its C handle, on Tokio's blocking pool, with statements prepared
//! once. A runtime shutting down while a batch runs waits for that batch to end (for as
//! long as the batch waits for another connection's lock: at most the busy timeout on a
//! file). The writer runs on the runtime the store was opened in and ends when the last
//! clone of the store is dropped; if it is gone (that runtime shut down), writes fail
//! with an error, never a silent success.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::SqlitePool;

use super::checkpoint::{self, Checkpointer, Checkpoints};
use super::dedicated::{self, Batch, BatchEnd, Batches};
use super::lease_time::{Now, statement};
use super::raw_connection::{Param, RawConnection, SqliteFailure};
use super::writers::StoreWrites;
use super::{COMPLETE, RECORD_STEP};
use crate::store::sql::CompletionColumns;
use crate::store::sql::batcher::{self, Batcher, Queued};
use crate::store::{FencingToken, StoreError, StoredResponse};

const RELEASE: &str = include_str!("sql/release.sql");
const RELEASE_KEEP: &str = include_str!("sql/release_keep.sql");

/// One write: a single statement and its parameters, owned so it can wait in the queue.
#[derive(Debug)]
pub(super) enum Write {
    /// A claim's insert of a new key (`claim_new.sql`) or fenced takeover `UPDATE` (whose
    /// `RETURNING steps`, for a lost lease, is the write's [`Written::steps`]).
    Claim {
        /// Which of the claim statements.
        statement: &'static str,
        /// `Claim` for the insert, `TakeOver` for an update.
        kind: WriteKind,
        scope: String,
        key: String,
        fingerprint: [u8; 32],
        fingerprint_version: i64,
        token: FencingToken,
        /// The lease's end on the wall clock.
        lease_expires_at: i64,
        /// The claim's instant, taken before its read.
        now: Now,
        expires_at: i64,
        /// The lease's end on the boot's clock (`None`: no boot, see `lease_time.rs`).
        lease_ends_boot: Option<i64>,
    },
    Renew {
        scope: String,
        key: String,
        token: FencingToken,
        lease_expires_at: i64,
        boot_id: Option<[u8; 16]>,
        lease_ends_boot: Option<i64>,
        /// The record's expiry at the least, on the wall clock: a TTL from now.
        keep_until: i64,
    },
    /// Appends one encoded step (`record_step.sql`).
    RecordStep {
        scope: String,
        key: String,
        token: FencingToken,
        /// `encode_step` of the step.
        step: Vec<u8>,
    },
    Complete {
        scope: String,
        key: String,
        token: FencingToken,
        response: StoredResponse,
    },
    /// Deletes the claim (`release.sql`), or, when it holds steps, ends its lease at
    /// `now` (`release_keep.sql`).
    Release {
        scope: String,
        key: String,
        token: FencingToken,
        now: Now,
    },
    Purge {
        now: Now,
        limit: i64,
    },
}

impl Write {
    fn kind(&self) -> WriteKind {
        match self {
            Self::Claim { kind, .. } => *kind,
            Self::Renew { .. } => WriteKind::Renew,
            Self::RecordStep { .. } => WriteKind::RecordStep,
            Self::Complete { .. } => WriteKind::Complete,
            Self::Release { .. } => WriteKind::Release,
            Self::Purge { .. } => WriteKind::Purge,
        }
    }

    /// Runs the statement; the rows it affected, and the steps a takeover returned.
    fn execute(&self, db: &mut RawConnection) -> Result<Written, StoreError> {
        let rows = match self {
            Self::Claim {
                statement,
                scope,
                key,
                fingerprint,
                fingerprint_version,
                token,
                lease_expires_at,
                now,
                expires_at,
                lease_ends_boot,
                ..
            } => {
                let params = [
                    Param::Text(scope),
                    Param::Text(key),
                    Param::Blob(fingerprint),
                    Param::Int(*fingerprint_version),
                    Param::Int(token.0),
                    Param::Int(*lease_expires_at),
                    Param::Int(now.wall),
                    Param::Int(*expires_at),
                    boot_param(now.boot_id.as_ref()),
                    Param::Int(now.boot),
                    lease_ends_boot.map_or(Param::Null, Param::Int),
                ];
                // A lost lease's takeover returns the steps it kept (a NULL column: none);
                // the other claim statements return no row.
                let (rows, steps) = db
                    .execute_returning(statement, &params, |row| row.bytes(0))
                    .map_err(|failure| StoreError::Database(failure.into_sqlx()))?;
                return Ok(Written {
                    rows,
                    steps: steps.flatten(),
                });
            }
            Self::Renew {
                scope,
                key,
                token,
                lease_expires_at,
                boot_id,
                lease_ends_boot,
                keep_until,
            } => db.execute(
                statement!("sql/renew.sql"),
                &[
                    Param::Text(scope),
                    Param::Text(key),
                    Param::Int(token.0),
                    Param::Int(*lease_expires_at),
                    boot_param(boot_id.as_ref()),
                    lease_ends_boot.map_or(Param::Null, Param::Int),
                    Param::Int(*keep_until),
                ],
            ),
            Self::RecordStep {
                scope,
                key,
                token,
                step,
            } => db.execute(
                RECORD_STEP,
                &[
                    Param::Text(scope),
                    Param::Text(key),
                    Param::Int(token.0),
                    Param::Blob(step),
                ],
            ),
            Self::Complete {
                scope,
                key,
                token,
                response,
            } => {
                let columns = CompletionColumns::of(response)?;
                db.execute(
                    COMPLETE,
                    &[
                        Param::Text(scope),
                        Param::Text(key),
                        Param::Int(token.0),
                        Param::Int(i64::from(columns.status)),
                        Param::Blob(&columns.headers),
                        columns.body.map_or(Param::Null, Param::Blob),
                    ],
                )
            }
            Self::Release {
                scope,
                key,
                token,
                now,
            } => release(db, scope, key, *token, *now),
            Self::Purge { now, limit } => db.execute(
                statement!("sql/purge.sql"),
                &[
                    Param::Int(now.wall),
                    Param::Int(*limit),
                    boot_param(now.boot_id.as_ref()),
                    Param::Int(now.boot),
                ],
            ),
        };
        let rows = rows.map_err(|failure| StoreError::Database(failure.into_sqlx()))?;
        Ok(Written { rows, steps: None })
    }
}

/// What a write did: the rows it affected and, for a takeover of a lost lease, the steps
/// its `RETURNING` read from the row it wrote (`None`: none, or another write).
#[derive(Debug, Default)]
pub(super) struct Written {
    pub(super) rows: u64,
    pub(super) steps: Option<Vec<u8>>,
}

/// `release`: deletes the claim `token` owns when it holds no steps, else keeps it with
/// its lease ended at `now` and its token [`FencingToken::RELEASED`]
/// (`release_keeps_record`); the rows affected (0: the token owns nothing).
///
/// Two statements, each fenced by the token, need no transaction around them: while the
/// token owns the record only this request changes its steps (and only by adding one),
/// so if neither matches, the token lost the record in between, and "owned nothing" is
/// true of that moment. A record without steps, the usual one, costs the one `DELETE`.
fn release(
    db: &mut RawConnection,
    scope: &str,
    key: &str,
    token: FencingToken,
    now: Now,
) -> Result<u64, SqliteFailure> {
    let deleted = db.execute(
        RELEASE,
        &[Param::Text(scope), Param::Text(key), Param::Int(token.0)],
    )?;
    if deleted > 0 {
        return Ok(deleted);
    }
    db.execute(
        RELEASE_KEEP,
        &[
            Param::Text(scope),
            Param::Text(key),
            Param::Int(token.0),
            Param::Int(now.wall),
            boot_param(now.boot_id.as_ref()),
            now.lease_ends_boot(Duration::ZERO)
                .map_or(Param::Null, Param::Int),
            Param::Int(FencingToken::RELEASED.0),
        ],
    )
}

/// A boot id as a statement parameter; NULL without one.
pub(super) fn boot_param(boot_id: Option<&[u8; 16]>) -> Param<'_> {
    boot_id.map_or(Param::Null, |id| Param::Blob(id))
}

/// What a write does, for [`GroupCommitStats`].
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriteKind {
    /// A claim's insert of a new key.
    Claim,
    /// A claim's takeover of an expired record or a lost lease.
    TakeOver,
    /// A renewal.
    Renew,
    /// A step recorded.
    RecordStep,
    /// A completion.
    Complete,
    /// A release.
    Release,
    /// A purge of expired records.
    Purge,
}

impl WriteKind {
    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// The writer's counters so far, for tests and diagnostics (not a stable API).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupCommitStats {
    /// Batches begun.
    pub batches: u64,
    /// Writes in the batches begun.
    pub writes: u64,
    /// The most writes one batch held.
    pub largest_batch: usize,
    /// Batches that held writes of more than one kind.
    pub mixed_batches: u64,
    /// Writes waiting in the queue now.
    pub queued: usize,
    /// WAL checkpoints the store's checkpointer ran (the writer's commits run none).
    pub checkpoints: u64,
    /// WAL checkpoints that failed (retried after the next batch).
    pub failed_checkpoints: u64,
    kinds_in_mixed_batches: u8,
}

impl GroupCommitStats {
    /// Whether some batch held a write of `kind` beside writes of another kind.
    pub fn mixed_with(&self, kind: WriteKind) -> bool {
        self.kinds_in_mixed_batches & kind.bit() != 0
    }
}

#[derive(Debug, Default)]
struct Counters {
    batches: AtomicU64,
    writes: AtomicU64,
    largest_batch: AtomicUsize,
    mixed_batches: AtomicU64,
    kinds_in_mixed_batches: AtomicU8,
}

impl Counters {
    fn count(&self, batch: &[Pending]) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.writes.fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.largest_batch.fetch_max(batch.len(), Ordering::Relaxed);
        let kinds = batch
            .iter()
            .fold(0u8, |kinds, p| kinds | p.item.kind().bit());
        if kinds.count_ones() > 1 {
            self.mixed_batches.fetch_add(1, Ordering::Relaxed);
            self.kinds_in_mixed_batches
                .fetch_or(kinds, Ordering::Relaxed);
        }
    }
}

/// A write waiting for its batch, and where its answer goes (the rows it affected).
type Pending = Queued<Write, Written>;

/// The handle callers send their writes through; clones share the one writer.
#[derive(Debug, Clone)]
pub(super) struct GroupCommit {
    writer: Batcher<Write, Written>,
    counters: Arc<Counters>,
    checkpoints: Arc<Checkpoints>,
}

/// What a write's caller is told when its transaction failed.
const FAILED: &str = "the write's transaction failed, nothing of it was committed";

impl GroupCommit {
    /// Starts the writer on the current Tokio runtime, writing through `pool`.
    /// A transaction beginning on `writes` takes the lock before the writer's next batch.
    pub(super) fn start(pool: SqlitePool, writes: Arc<StoreWrites>) -> Self {
        let (batcher, waiting) = Batcher::channel(
            "the SQLite store's writer did not answer (it stopped, or its batch failed unexpectedly); the write was not committed",
        );
        let counters = Arc::new(Counters::default());
        let checkpoints = Arc::new(Checkpoints::default());
        let writer = Writer {
            writes,
            counters: counters.clone(),
            checkpointer: Checkpointer::start(pool.clone(), checkpoints.clone()),
        };
        tokio::spawn(dedicated::serve(pool, writer, waiting));
        Self {
            writer: batcher,
            counters,
            checkpoints,
        }
    }

    /// Runs `write` in the next batch; the rows it affected, once its batch committed.
    pub(super) async fn write(&self, write: Write) -> Result<u64, StoreError> {
        Ok(self.writer.ask(write).await?.rows)
    }

    /// Like [`write`](Self::write), with what a `RETURNING` clause read ([`Written`]).
    pub(super) async fn write_returning(&self, write: Write) -> Result<Written, StoreError> {
        self.writer.ask(write).await
    }

    pub(super) fn stats(&self) -> GroupCommitStats {
        let c = &self.counters;
        GroupCommitStats {
            batches: c.batches.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            largest_batch: c.largest_batch.load(Ordering::Relaxed),
            mixed_batches: c.mixed_batches.load(Ordering::Relaxed),
            queued: self.writer.queued(),
            checkpoints: self.checkpoints.done(),
            failed_checkpoints: self.checkpoints.failed(),
            kinds_in_mixed_batches: c.kinds_in_mixed_batches.load(Ordering::Relaxed),
        }
    }
}

/// The writer's work: its batches are group commits.
struct Writer {
    writes: Arc<StoreWrites>,
    counters: Arc<Counters>,
    /// Checkpoints the WAL its commits grow (they run none themselves).
    checkpointer: Checkpointer,
}

impl Batches for Writer {
    type Item = Write;
    type Reply = Written;

    const SETUP: Option<&'static str> = Some(checkpoint::WRITER_SETUP);

    const FAILED: &'static str = FAILED;

    async fn prepare(&self, batch: &mut Batch<Self>) {
        // A transactional handler about to take the lock goes first (see `writers.rs`).
        self.writes.let_transactions_begin().await;
        renewals_first(batch);
        if !batch.is_empty() {
            self.counters.count(batch);
            self.checkpointer.batch_begins();
        }
    }

    fn run(db: &mut RawConnection, batch: &mut Batch<Self>) -> BatchEnd {
        run_batch(db, batch)
    }
}

/// **The renewal rule**: a renewal that reached the writer is applied, and before the
/// batch's other writes. A caller that gave up (the engine's store timeout) gets no other
/// write it stopped waiting for, but a renewal whose caller timed out behind a held write
/// lock is still the live owner's: dropping it, or running a retry's takeover before it,
/// would let the retry take over a handler that is still running. Applying it late is
/// safe, as its lease end was fixed when it was sent; moving it first within the batch is
/// one of the orders in which its writes, all waiting at once, could have arrived.
fn renewals_first(batch: &mut Vec<Pending>) {
    batch.retain(|pending| !pending.gave_up() || matches!(pending.item, Write::Renew { .. }));
    let after_renewals = |pending: &Pending| !matches!(pending.item, Write::Renew { .. });
    // Stable: every other write keeps its arrival order. Most batches are in order already.
    if !batch.is_sorted_by_key(after_renewals) {
        batch.sort_by_key(after_renewals);
    }
}

/// The batch's statements in one `BEGIN IMMEDIATE … COMMIT` (a batch of one: the
/// statement alone, autocommitted), on the blocking pool; answers each write once the
/// transaction committed or failed. Leaves `batch` empty.
fn run_batch(db: &mut RawConnection, batch: &mut Vec<Pending>) -> BatchEnd {
    if let [alone] = &batch[..] {
        // Nothing to share the transaction with: the statement commits on its own
        // (autocommit) before it returns.
        let result = alone.item.execute(db);
        let end = if result.is_ok() {
            BatchEnd::Clean
        } else {
            dedicated::end_transaction(db)
        };
        if let Some(pending) = batch.pop() {
            pending.answer(result);
        }
        return end;
    }
    if let Err(e) = db.execute(dedicated::BEGIN_IMMEDIATE, &[]) {
        batcher::fail_all(batch, FAILED, Vec::new(), e.into_sqlx());
        return dedicated::end_transaction(db);
    }
    let mut done = Vec::with_capacity(batch.len());
    for pending in batch.iter() {
        let result = pending.item.execute(db);
        // A constraint failure undid only its own statement (SQLite's statement
        // atomicity): the transaction goes on. Any other failure may have ended it.
        let fatal = match &result {
            Err(StoreError::Database(e)) if !is_constraint(e) => Some(e.to_string()),
            _ => None,
        };
        done.push(result);
        if let Some(reason) = fatal {
            let end = dedicated::end_transaction(db);
            batcher::fail_all(batch, FAILED, done, sqlx::Error::Protocol(reason));
            return end;
        }
    }
    match db.execute(dedicated::COMMIT, &[]) {
        Ok(_) => {
            for (pending, result) in batch.drain(..).zip(done) {
                pending.answer(result);
            }
            BatchEnd::Clean
        }
        Err(e) => {
            let end = dedicated::end_transaction(db);
            batcher::fail_all(batch, FAILED, done, e.into_sqlx());
            end
        }
    }
}

/// SQLITE_CONSTRAINT, with any extended code: the statement was refused and undone, the
/// transaction is intact.
fn is_constraint(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = error else {
        return false;
    };
    db.code()
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| code & 0xff == 19)
}
