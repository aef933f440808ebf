//! A task that runs queued work in batches on a connection of its own: the store's
//! writer (`group_commit.rs`) and its reader of claims (`group_read.rs`).
//!
//! The task takes one connection out of the store's pool (the pool may open a
//! replacement) and keeps it, with its statements prepared once, for as long as it
//! works. Each batch — everything waiting, up to a bound — runs on the connection's C
//! handle in a single call on Tokio's blocking pool (`raw_connection.rs`): one hand-off
//! between threads per batch instead of one per statement through sqlx's connection
//! thread, and the runtime's threads never wait for SQLite's locks or fsyncs. While one
//! batch runs the next one gathers, so batches grow with the load and add no wait when
//! there is none. A batch that leaves the connection in an unknown state gets it closed
//! and replaced by another from the pool. The task ends when every sender is dropped.

use std::future::Future;

use sqlx::{Connection, SqliteConnection, SqlitePool};
use tokio::sync::{mpsc, oneshot};

use super::raw_connection::{Lending, RawConnection};
use crate::store::StoreError;

// A batch's transaction statements, prepared once per connection like the batch's own
// statements: `static`s, so each has one address (which keys the prepared statement).
/// Begins a read transaction (the reader's batches).
pub(super) static BEGIN: &str = "BEGIN";
/// Begins a write transaction, taking the write lock at once (the writer's batches).
pub(super) static BEGIN_IMMEDIATE: &str = "BEGIN IMMEDIATE";
/// Ends either.
pub(super) static COMMIT: &str = "COMMIT";

/// Where a queued item's answer goes.
pub(super) type Reply<R> = oneshot::Sender<Result<R, StoreError>>;

/// Queues the item `with_reply` builds around its reply channel and waits for the
/// answer. A task that is gone (its runtime shut down) or dropped the item unanswered is
/// an error saying `what` did not happen, never a success.
pub(super) async fn ask<I, R>(
    queue: &mpsc::Sender<I>,
    with_reply: impl FnOnce(Reply<R>) -> I,
    what: &'static str,
) -> Result<R, StoreError> {
    let stopped = || StoreError::backend(std::io::Error::other(what));
    let (reply, answer) = oneshot::channel();
    queue.send(with_reply(reply)).await.map_err(|_| stopped())?;
    answer.await.map_err(|_| stopped())?
}

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
    /// One queued piece of work, with where its answer goes.
    type Item: Send + 'static;

    /// A statement run once on each connection the task takes, before its first batch.
    const SETUP: Option<&'static str> = None;

    /// Before each batch, on the runtime: may wait, and may drop items that need not
    /// run any more.
    fn prepare(&self, batch: &mut Vec<Self::Item>) -> impl Future<Output = ()> + Send;

    /// Runs `batch` on the connection (on the blocking pool) and answers each item;
    /// leaves it empty.
    fn run(db: &mut RawConnection, batch: &mut Vec<Self::Item>) -> BatchEnd;

    /// Answers each item of `batch` with `error`: there is no connection to run it on.
    fn fail(batch: &mut Vec<Self::Item>, error: sqlx::Error);
}

/// Runs the batches of `work` from `waiting`, at most `max_batch` items each, until
/// every sender is dropped.
pub(super) async fn serve<B: Batches>(
    pool: SqlitePool,
    work: B,
    mut waiting: mpsc::Receiver<B::Item>,
    max_batch: usize,
) {
    let mut batch = Vec::with_capacity(max_batch);
    while waiting.recv_many(&mut batch, max_batch).await > 0 {
        let mut conn = match pool.acquire().await {
            Ok(conn) => conn.detach(),
            Err(e) => {
                B::fail(&mut batch, e);
                continue;
            }
        };
        if let Some(setup) = B::SETUP
            && let Err(e) = sqlx::Executor::execute(&mut conn, setup).await
        {
            B::fail(&mut batch, e);
            let _ = conn.close().await;
            continue;
        }
        batch = serve_on(&mut conn, &work, batch, &mut waiting, max_batch).await;
        // Broken, or every sender dropped.
        let _ = conn.close().await;
    }
}

/// Borrows `conn`'s handle and runs batch after batch on it, until a batch leaves it in
/// an unknown state or every sender is dropped. Returns the batch, emptied, for reuse.
async fn serve_on<B: Batches>(
    conn: &mut SqliteConnection,
    work: &B,
    mut batch: Vec<B::Item>,
    waiting: &mut mpsc::Receiver<B::Item>,
    max_batch: usize,
) -> Vec<B::Item> {
    let mut locked = match conn.lock_handle().await {
        Ok(locked) => locked,
        Err(e) => {
            B::fail(&mut batch, e);
            return batch;
        }
    };
    // SAFETY: `lending` is dropped (explicitly below, or with this future), never
    // forgotten; its drop waits for a batch still running on the handle.
    let lending = unsafe { Lending::new(&mut locked) };
    loop {
        gather(&mut batch, waiting, max_batch).await;
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
                        B::fail(&mut batch, stuck());
                        return (batch, BatchEnd::Broken);
                    }
                    let end = B::run(db, &mut batch);
                    (batch, end)
                })
                .await;
            let end;
            (batch, end) = ran.unwrap_or_else(|| (Vec::with_capacity(max_batch), BatchEnd::Broken));
            end
        };
        if end == BatchEnd::Broken || waiting.recv_many(&mut batch, max_batch).await == 0 {
            break;
        }
    }
    drop(lending);
    drop(locked);
    batch
}

/// How many times [`gather`] yields for one batch at most.
const GATHER_ROUNDS: usize = 8;

/// Lets the tasks that are ready to run send their items before the batch is taken: a
/// yield to the scheduler, then whatever arrived, again while items keep arriving and the
/// batch has room ([`GATHER_ROUNDS`] times at most). With nothing else ready a yield
/// comes straight back, so an idle store adds no wait; under load the batch fills from
/// requests already in flight instead of committing the first few of them alone (at
/// `synchronous = NORMAL`, where a commit is short, the writer's batches averaged 3.5
/// writes without this and 46 with it). The writer and the reader (`group_read.rs`)
/// both gather so.
async fn gather<T>(batch: &mut Vec<T>, waiting: &mut mpsc::Receiver<T>, max_batch: usize) {
    if batch.len() >= max_batch {
        return;
    }
    // A yield can last a whole round of the worker's other tasks: under a trickle of
    // writes, the batch's first callers wait for at most this many of them.
    for _ in 0..GATHER_ROUNDS {
        tokio::task::yield_now().await;
        let before = batch.len();
        while batch.len() < max_batch {
            match waiting.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        if batch.len() == before || batch.len() >= max_batch {
            return;
        }
    }
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
