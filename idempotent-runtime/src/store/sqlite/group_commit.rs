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
//! - **The same effects.** Each write is its single statement (an insert unless the key
//!   has a record, a compare-and-set on the record's version, a delete by version), run
//!   in the batch's order (below): writes on one key in one batch see each other's
//!   effects exactly as they would one transaction after another. A write that changed
//!   nothing is answered the record as the batch leaves it, read in the same
//!   transaction.
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
//! - **Renewals are never dropped, and go first** (`in_batch_order`). A write lock held
//!   elsewhere (a transactional handler, another process) stalls the batch, and the
//!   renewals queued behind it time out in their callers after a third of their lease.
//!   Dropped, the lease would run out in the store under a live handler, and a retry's
//!   takeover queued behind the same lock would commit the moment it frees. So a renewal
//!   that reached the writer is applied, before the other writes of its batch: a
//!   takeover is judged on the lease of the owner's last renewal sent before it. This
//!   holds within one store; a store in another process sharing the file races its own
//!   writes for the lock, see the module docs of `SqliteStore`.
//! - **Takeovers go next.** A batch's first compare-and-set on a record wins and makes
//!   the others on it stale; a stale write is answered last and queued again last. An
//!   owner whose lease was lost yet records steps as fast as the writer takes them would
//!   so keep a retry's takeover stale batch after batch; after the renewals, a takeover
//!   goes first.
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

use sqlx::SqlitePool;

use super::dedicated::{self, Batch, BatchEnd, Batches};
use super::lease_time::Now;
use super::raw_connection::{Param, RawConnection, SqliteFailure};
use super::records::{READ, record_at};
use super::writers::StoreWrites;
use crate::clock::Clock;
use crate::store::sql::batcher::{self, Batcher, Queued};
use crate::store::{Record, StoreError};

/// A statement's parameter, owned so its write can wait in the queue.
#[derive(Debug, Clone)]
pub(super) enum Value {
    Text(String),
    Blob(Vec<u8>),
    Int(i64),
    Null,
}

impl Value {
    fn param(&self) -> Param<'_> {
        match self {
            Self::Text(text) => Param::Text(text),
            Self::Blob(bytes) => Param::Blob(bytes),
            Self::Int(int) => Param::Int(*int),
            Self::Null => Param::Null,
        }
    }
}

/// One write: a statement of `records.rs`, run once for each set of parameters (each
/// beginning `?1` scope, `?2` key).
#[derive(Debug)]
pub(super) struct Write {
    kind: WriteKind,
    statement: &'static str,
    each: Vec<Vec<Value>>,
    /// When the statement changed nothing, read the record back, at this clock's now.
    read_back: Option<Arc<dyn Clock>>,
}

impl Write {
    /// `statement` with `values`.
    pub(super) fn one(kind: WriteKind, statement: &'static str, values: Vec<Value>) -> Self {
        Self::each(kind, statement, vec![values])
    }

    /// `statement` with each of `each`, in order (a purge's deletes).
    pub(super) fn each(kind: WriteKind, statement: &'static str, each: Vec<Vec<Value>>) -> Self {
        Self {
            kind,
            statement,
            each,
            read_back: None,
        }
    }

    /// When the statement changes no row, reads the record of its key back, in the same
    /// call (and transaction), at `clock`'s now then: an insert's conflict, a stale
    /// compare-and-set. (Not the caller's now: the write may have waited behind a lock
    /// that long.)
    pub(super) fn reading_back(mut self, clock: Arc<dyn Clock>) -> Self {
        self.read_back = Some(clock);
        self
    }

    fn kind(&self) -> WriteKind {
        self.kind
    }

    /// A renewal (see [`in_batch_order`]).
    fn is_renewal(&self) -> bool {
        self.kind == WriteKind::Renew
    }

    /// Runs the statement: the rows it changed.
    fn execute(&self, db: &mut RawConnection) -> Result<Written, StoreError> {
        let mut rows = 0;
        let mut params = Vec::new();
        for values in &self.each {
            params.clear();
            params.extend(values.iter().map(Value::param));
            rows += db.execute(self.statement, &params).map_err(failed)?;
        }
        Ok(Written::Changed(rows))
    }

    /// What the write answers once its batch's statements all ran: a write reading back
    /// that changed nothing gets the record as the batch leaves it (not as it was right
    /// after its own statement, which later writes of the batch may have changed: its
    /// next attempt would be stale again).
    fn finish(&self, db: &mut RawConnection, written: Written) -> Result<Written, StoreError> {
        let (Some(clock), Written::Changed(0), Some(values)) =
            (&self.read_back, &written, self.each.first())
        else {
            return Ok(written);
        };
        let now = Now::of(clock.as_ref());
        let params: Vec<Param<'_>> = values[..2].iter().map(Value::param).collect();
        let record = db
            .query_row(READ, &params, |row| record_at(row, 0, now))
            .map_err(failed)?
            .transpose()?;
        Ok(Written::Found(record, now))
    }
}

fn failed(failure: SqliteFailure) -> StoreError {
    StoreError::Database(failure.into_sqlx())
}

/// What a write did.
#[derive(Debug)]
pub(super) enum Written {
    /// Its statement changed this many rows.
    Changed(u64),
    /// It changed none, and its key's record is this (`None`: there is none), read at
    /// this instant.
    Found(Option<Record>, Now),
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
        let writer = Writer {
            writes,
            counters: counters.clone(),
        };
        tokio::spawn(dedicated::serve(pool, writer, waiting));
        Self {
            writer: batcher,
            counters,
        }
    }

    /// Runs `write` in the next batch; what it did, once its batch committed.
    pub(super) async fn write(&self, write: Write) -> Result<Written, StoreError> {
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
            kinds_in_mixed_batches: c.kinds_in_mixed_batches.load(Ordering::Relaxed),
        }
    }
}

/// The writer's work: its batches are group commits.
struct Writer {
    writes: Arc<StoreWrites>,
    counters: Arc<Counters>,
}

impl Batches for Writer {
    type Item = Write;
    type Reply = Written;

    const FAILED: &'static str = FAILED;

    async fn prepare(&self, batch: &mut Batch<Self>) {
        // A transactional handler about to take the lock goes first (see `writers.rs`).
        self.writes.let_transactions_begin().await;
        in_batch_order(batch);
        if !batch.is_empty() {
            self.counters.count(batch);
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
///
/// Then the takeovers (see the module docs), then the rest.
fn in_batch_order(batch: &mut Vec<Pending>) {
    batch.retain(|pending| !pending.gave_up() || pending.item.is_renewal());
    let place = |pending: &Pending| match pending.item.kind() {
        WriteKind::Renew => 0,
        WriteKind::TakeOver => 1,
        _ => 2,
    };
    // Stable: every other write keeps its arrival order. Most batches are in order already.
    if !batch.is_sorted_by_key(place) {
        batch.sort_by_key(place);
    }
}

/// The batch's statements in one `BEGIN IMMEDIATE … COMMIT` (a batch of one: the
/// statement alone, autocommitted), on the blocking pool; answers each write once the
/// transaction committed or failed. Leaves `batch` empty.
fn run_batch(db: &mut RawConnection, batch: &mut Vec<Pending>) -> BatchEnd {
    if let [alone] = &batch[..] {
        // Nothing to share the transaction with: the statement commits on its own
        // (autocommit) before it returns.
        let result = alone
            .item
            .execute(db)
            .and_then(|written| alone.item.finish(db, written));
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
    let done: Vec<_> = batch
        .iter()
        .zip(done)
        .map(|(pending, result)| result.and_then(|written| pending.item.finish(db, written)))
        .collect();
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
