//! A task that runs queued work in batches on a connection of its own: the store's
//! writer (`group_commit.rs`) and its reader of claims (`group_read.rs`). The queue, the
//! gather, the replies and the bounds are the shared batcher skeleton
//! (`store/sql/batcher.rs`); this module is what SQLite adds to it.
//!
//! What it buys: each batch, everything waiting, runs on the connection's C handle in a
//! single call on Tokio's blocking pool (`raw_connection.rs`), one hand-off between
//! threads per batch instead of one per statement through sqlx's connection thread, with
//! statements prepared once per connection; and the runtime's threads never wait for
//! SQLite's locks or fsyncs. The task takes one connection out of the store's pool (the
//! pool may open a replacement) and keeps it for as long as it works; a batch that leaves
//! the connection in an unknown state gets it closed and replaced by another from the
//! pool. The task ends when every sender is dropped.

use std::future::Future;

use sqlx::{Connection, SqliteConnection, SqlitePool};

use super::raw_connection::{Lending, RawConnection};
use crate::store::sql::batcher::{self, MAX_BATCH, Queued, Waiting};

// A batch's transaction statements, prepared once per connection like the batch's own
// statements: `static`s, so each has one address (which keys the prepared statement).
/// Begins a read transaction (the reader's batches).
pub(super) static BEGIN: &str = "BEGIN";
/// Begins a write transaction, taking the write lock at once (the writer's batches).
pub(super) static BEGIN_IMMEDIATE: &str = "BEGIN IMMEDIATE";
/// Ends either.
pub(super) static COMMIT: &str = "COMMIT";

/// One kind of task's queued work: an item and where its answer goes.
pub(super) type Batch<B> = Vec<Queued<<B as Batches>::Item, <B as Batches>::Reply>>;

/// What a batch left its connection in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BatchEnd {
    /// No transaction open: every item answered, the connection is fit for the next.
    Clean,
    /// An unknown state (a transaction that would not roll back, a batch that did not
    /// run to its end): the connection must not be used again.
    Broken,
}

/// The work one kind of task does with its batches.
pub(super) trait Batches: Send + Sync + 'static {
    /// One queued piece of work.
    type Item: Send + 'static;
    /// What its caller gets back.
    type Reply: Send + 'static;

    /// What a caller is told when its batch could not run at all (no connection, or one
    /// stuck in a transaction).
    const FAILED: &'static str;

    /// Before each batch, on the runtime: may wait, and may drop items that need not
    /// run any more.
    fn prepare(&self, batch: &mut Batch<Self>) -> impl Future<Output = ()> + Send;

    /// Runs `batch` on the connection (on the blocking pool) and answers each item;
    /// leaves it empty.
    fn run(db: &mut RawConnection, batch: &mut Batch<Self>) -> BatchEnd;
}

/// Answers each item of `batch` with `error`: there is no connection to run it on.
fn fail<B: Batches>(batch: &mut Batch<B>, error: sqlx::Error) {
    batcher::fail_all(batch, B::FAILED, Vec::new(), error);
}

/// Runs the batches of `work` from `waiting` until every sender is dropped.
pub(super) async fn serve<B: Batches>(
    pool: SqlitePool,
    work: B,
    mut waiting: Waiting<B::Item, B::Reply>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while waiting.recv(&mut batch).await {
        let mut conn = match pool.acquire().await {
            Ok(conn) => conn.detach(),
            Err(e) => {
                fail::<B>(&mut batch, e);
                continue;
            }
        };
        batch = serve_on(&mut conn, &work, batch, &mut waiting).await;
        // Broken, or every sender dropped.
        let _ = conn.close().await;
    }
}

/// Borrows `conn`'s handle and runs batch after batch on it, until a batch leaves it in
/// an unknown state or every sender is dropped. Returns the batch, emptied, for reuse.
async fn serve_on<B: Batches>(
    conn: &mut SqliteConnection,
    work: &B,
    mut batch: Batch<B>,
    waiting: &mut Waiting<B::Item, B::Reply>,
) -> Batch<B> {
    let mut locked = match conn.lock_handle().await {
        Ok(locked) => locked,
        Err(e) => {
            fail::<B>(&mut batch, e);
            return batch;
        }
    };
    // SAFETY: `lending` is dropped (explicitly below, or with this future), never
    // forgotten; its drop waits for a batch still running on the handle.
    let lending = unsafe { Lending::new(&mut locked) };
    loop {
        waiting.gather(&mut batch).await;
        work.prepare(&mut batch).await;
        let end = if batch.is_empty() {
            BatchEnd::Clean
        } else {
            // One hand-off for the whole batch. If it does not come back (it panicked,
            // or the runtime is shutting down), its items were dropped unanswered: their
            // callers get an error saying so, never a success.
            let ran = lending
                .run(move |db| {
                    // A connection handed over inside a transaction (an app's raw `BEGIN`
                    // on a pool it shares with the store) would hold the batch's writes
                    // uncommitted: that transaction is ended first.
                    if end_transaction(db) == BatchEnd::Broken {
                        fail::<B>(&mut batch, stuck());
                        return (batch, BatchEnd::Broken);
                    }
                    let end = B::run(db, &mut batch);
                    (batch, end)
                })
                .await;
            let end;
            (batch, end) = ran.unwrap_or_else(|| (Vec::with_capacity(MAX_BATCH), BatchEnd::Broken));
            end
        };
        if end == BatchEnd::Broken || !waiting.recv(&mut batch).await {
            break;
        }
    }
    drop(lending);
    drop(locked);
    batch
}

/// The error for a connection stuck in a transaction that would not roll back.
fn stuck() -> sqlx::Error {
    sqlx::Error::Protocol("the connection is stuck in a transaction that will not roll back".into())
}

/// Rolls back a transaction still open (after a failed statement, or one the connection
/// came with); whether the connection is fit for the next batch.
pub(super) fn end_transaction(db: &mut RawConnection) -> BatchEnd {
    if db.in_transaction() {
        let _ = db.exec(c"ROLLBACK");
    }
    if db.in_transaction() {
        BatchEnd::Broken
    } else {
        BatchEnd::Clean
    }
}
