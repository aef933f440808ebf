//! Group commit on Postgres: concurrent claims, and concurrent completions, each batched
//! into one statement — one round trip, one transaction, one WAL flush for the batch.
//!
//! Every Postgres commit waits for its WAL flush, and every statement costs the server a
//! protocol exchange, a transaction and a wake-up of its backend. On a fresh key those
//! fixed costs were most of the work (two statements, two commits): on a 2-core machine
//! the server's CPU, not the disk, was the limit. Here a caller sends its claim (or
//! completion) with a reply channel to the store's batcher for that statement; the
//! batcher takes every claim waiting, up to [`MAX_BATCH`], runs them as one
//! `sql/claim.sql` (arrays in, one row per claim out), and answers each caller once the
//! statement, an autocommitted transaction, returned. While one batch runs, the next one
//! gathers: batches grow with the load, with no added wait when there is none (a lone
//! claim runs at once, as a batch of one).
//!
//! What every claim and completion keeps:
//!
//! - **Durable before answered.** A claim is committed before its handler runs, a
//!   completion before its response is sent: the reply follows the statement's commit.
//! - **The same decisions.** The batched statement applies, per element, exactly the
//!   single claim's logic (snapshot read, takeover rule, fenced insert-or-take-over);
//!   completions are fenced by token and state as alone. A (scope, key) appears at most
//!   once per statement, so claims of one key in one instance still see each other one
//!   after another. A duplicate that came with the batch gets the answer it would have
//!   had right after the first (a claim behind a claim that succeeded: in progress, or
//!   mismatched; behind a refused one with the same fingerprint: the same refusal), and
//!   otherwise runs in the next batch. So 50 concurrent duplicates cost one statement,
//!   not 50 one after another.
//! - **A failed batch fails only its own callers**, each with an error (`503` from the
//!   engine); nothing of it was committed. A batch the server aborted as a deadlock or
//!   serialization failure (possible only against another instance's batch taking the
//!   same keys in another order; batches are sorted by key to make it rarer) is run once
//!   more before it fails.
//! - **Bounded.** [`MAX_BATCH`] per statement, [`QUEUE`] waiting; a caller finding the
//!   queue full waits for room (and for the engine's store timeout). A claim or
//!   completion whose caller gave up before its batch began is not run.
//!
//! Each batcher is a task, spawned on the runtime the store was opened in, that borrows a
//! statement connection (`connections.rs`) per batch and ends when the last clone of the
//! store is dropped; if it is gone (that runtime shut down), claims and completions fail
//! with an error, never a silent success.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;

use sqlx::SqlStr;
use sqlx::postgres::PgConnection;
use tokio::sync::{mpsc, oneshot};

use super::connections::StatementConnections;
use crate::store::StoreError;
use crate::store::sql::BatchFailed;

/// Claims (or completions) per statement at most: bounds the statement's size and the
/// latency of the batch's first caller.
pub(super) const MAX_BATCH: usize = 64;

/// Callers waiting for a batcher at most; more wait for room.
pub(super) const QUEUE: usize = 1024;

/// What one batcher batches: claims or completions.
pub(super) trait Batch: Send + Sync + Sized + 'static {
    /// What each caller gets back.
    type Reply: Send + 'static;

    /// The record it is about: `(scope, key)`, distinct within a batch.
    fn record(&self) -> (&str, &str);

    /// Runs `batch` (sorted by record, records distinct) as one statement on `db`;
    /// exactly one reply per element, in order. `Err`: the statement failed, nothing of
    /// it was committed.
    /// The answer of `self`, which came in the same batch as `first` for the same
    /// record, as if it had run right after `first` answered `first_reply`; `None`: it
    /// runs in the next batch instead.
    fn after_first(&self, first: &Self, first_reply: &Self::Reply) -> Option<Self::Reply>;

    fn run<'c>(
        statement: &'c SqlStr,
        db: &'c mut PgConnection,
        batch: &'c [&'c Self],
    ) -> impl Future<Output = Result<Vec<Result<Self::Reply, StoreError>>, sqlx::Error>> + Send + 'c;
}

/// One caller's item and where its answer goes.
struct Queued<B: Batch> {
    item: B,
    reply: oneshot::Sender<Result<B::Reply, StoreError>>,
}

/// The sending side of one batcher task.
pub(super) struct Batcher<B: Batch> {
    queue: mpsc::Sender<Queued<B>>,
}

impl<B: Batch> Batcher<B> {
    /// Spawns the batcher for `statement` on the current runtime.
    pub(super) fn start(statement: SqlStr, connections: Arc<StatementConnections>) -> Self {
        let (queue, waiting) = mpsc::channel(QUEUE);
        tokio::spawn(serve(statement, connections, waiting));
        Self { queue }
    }

    /// Sends `item` to be run in the next batch and waits for its answer.
    pub(super) async fn ask(&self, item: B) -> Result<B::Reply, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Queued { item, reply })
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

fn stopped() -> StoreError {
    StoreError::backend(std::io::Error::other(
        "the Postgres store's group commit task is gone (its runtime shut down)",
    ))
}

/// The batcher's loop: gathers a batch, runs it, answers it; until every sender is gone.
async fn serve<B: Batch>(
    statement: SqlStr,
    connections: Arc<StatementConnections>,
    mut waiting: mpsc::Receiver<Queued<B>>,
) {
    // Items taken from the queue but left for a later batch (their record was already
    // in the batch): they go first next time.
    let mut deferred: VecDeque<Queued<B>> = VecDeque::new();
    let mut batch: Vec<Queued<B>> = Vec::with_capacity(MAX_BATCH);
    loop {
        if deferred.is_empty() {
            match waiting.recv().await {
                Some(first) => deferred.push_back(first),
                None => return,
            }
        }
        // Duplicates of a record already in the batch, in arrival order.
        let mut duplicates = Vec::new();
        while batch.len() < MAX_BATCH {
            let Some(next) = deferred.pop_front().or_else(|| waiting.try_recv().ok()) else {
                break;
            };
            if next.reply.is_closed() {
                // Its caller gave up (the engine's store timeout): nobody would act on it.
                continue;
            }
            if batch.iter().any(|b| b.item.record() == next.item.record()) {
                duplicates.push(next);
            } else {
                batch.push(next);
            }
        }
        if batch.is_empty() {
            continue;
        }
        let replies = run_batch(&statement, &connections, &mut batch).await;
        // Before the batch's own answers go out, so a duplicate is derived from them.
        let mut later = VecDeque::new();
        for duplicate in duplicates {
            let derived = replies.as_ref().and_then(|replies| {
                let first = batch
                    .iter()
                    .position(|b| b.item.record() == duplicate.item.record())?;
                let Ok(first_reply) = &replies[first] else {
                    return None;
                };
                duplicate.item.after_first(&batch[first].item, first_reply)
            });
            match derived {
                Some(reply) => {
                    let _ = duplicate.reply.send(Ok(reply));
                }
                None => later.push_back(duplicate),
            }
        }
        answer_all(&mut batch, replies);
        later.extend(deferred.drain(..));
        deferred = later;
    }
}

/// Sends each caller of `batch` its answer (an error for all when `replies` is `None`);
/// leaves `batch` empty.
fn answer_all<B: Batch>(
    batch: &mut Vec<Queued<B>>,
    replies: Option<Vec<Result<B::Reply, StoreError>>>,
) {
    let Some(replies) = replies else { return };
    for (queued, reply) in batch.drain(..).zip(replies) {
        // A caller gone by now (store timeout) has its answer dropped.
        let _ = queued.reply.send(reply);
    }
}

/// Runs one batch (sorted by record first); its answers, one per element, or `None`
/// when it failed and every caller in it has been answered with an error (`batch` is
/// then empty).
async fn run_batch<B: Batch>(
    statement: &SqlStr,
    connections: &StatementConnections,
    batch: &mut Vec<Queued<B>>,
) -> Option<Vec<Result<B::Reply, StoreError>>> {
    // One lock order for every batch (see the module docs).
    batch.sort_unstable_by(|a, b| a.item.record().cmp(&b.item.record()));
    let items: Vec<&B> = batch.iter().map(|queued| &queued.item).collect();
    let mut result = run_on_a_connection(statement, connections, &items).await;
    if matches!(&result, Err(error) if worth_running_again(error)) {
        result = run_on_a_connection(statement, connections, &items).await;
    }
    drop(items);
    match result {
        Ok(replies) if replies.len() == batch.len() => return Some(replies),
        Ok(replies) => fail_all(
            batch,
            sqlx::Error::Protocol(format!(
                "a batch of {} got {} answers",
                batch.len(),
                replies.len()
            )),
        ),
        Err(error) => fail_all(batch, error),
    }
    None
}

async fn run_on_a_connection<B: Batch>(
    statement: &SqlStr,
    connections: &StatementConnections,
    items: &[&B],
) -> Result<Vec<Result<B::Reply, StoreError>>, sqlx::Error> {
    let mut lent = connections.acquire().await?;
    let replies = B::run(statement, lent.connection(), items).await?;
    lent.release();
    Ok(replies)
}

/// A deadlock or serialization failure: the server rolled the statement back, and the
/// same statement may well succeed now.
fn worth_running_again(error: &sqlx::Error) -> bool {
    let code = error.as_database_error().and_then(|e| e.code());
    matches!(code.as_deref(), Some("40P01" | "40001"))
}

fn fail_all<B: Batch>(batch: &mut Vec<Queued<B>>, error: sqlx::Error) {
    tracing::warn!(
        %error,
        items = batch.len(),
        "a Postgres group commit statement failed; none of its items was committed"
    );
    let error = Arc::new(error);
    for queued in batch.drain(..) {
        let _ = queued
            .reply
            .send(Err(StoreError::backend(BatchFailed(Arc::clone(&error)))));
    }
}
