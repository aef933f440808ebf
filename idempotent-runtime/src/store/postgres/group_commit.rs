//! Group commit on Postgres: concurrent claims, and concurrent completions, each batched
//! into one statement — one round trip, one transaction, one WAL flush for the batch.
//!
//! Every Postgres commit waits for its WAL flush, and every statement costs the server a
//! protocol exchange, a transaction and a wake-up of its backend; on a fresh key those
//! fixed costs are most of the work, so the server's CPU, not its disk, is the limit.
//! What batching buys: those costs paid once per batch instead of once per request. A
//! caller sends its claim (or completion) with a reply channel to the store's batcher for
//! that statement (the batcher skeleton, `store/sql/batcher.rs`); the batcher takes every
//! claim waiting, up to [`MAX_BATCH`], runs them as one `sql/claim.sql` (arrays in, one
//! row per claim out), and answers each caller once the statement, an autocommitted
//! transaction, returned. While one batch runs, the next one gathers: batches grow with
//! the load, with no added wait when there is none (a lone claim runs at once, as a batch
//! of one).
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
//!   otherwise runs in the next batch. So concurrent duplicates cost one statement, not
//!   one each after another.
//! - **One element the server refuses fails alone.** A statement the server refused (an
//!   error it reported: a value it cannot store, a constraint) committed nothing; its
//!   elements then run one statement each, so only the one at fault gets its error. A
//!   statement aborted as a deadlock or serialization failure (against another
//!   instance's batch or a transaction taking the same rows in another order; claims are
//!   inserted in key order to make it rarer) runs once more first.
//! - **A lost connection fails its batch.** An I/O error or [`BATCH_TIMEOUT`] (the
//!   connection waited for, or the statement, took longer: a dead socket, a long row
//!   lock) answers every caller of the batch with an error (`503`) and closes the
//!   connection; the next batch gets another. Such a batch is not run again: its
//!   statement may have committed, and the engine's own retry rules then apply (a claim
//!   that committed with nobody to run it holds its key until its lease runs out).
//! - **Bounded.** [`MAX_BATCH`] elements and [`MAX_BATCH_BYTES`] of responses per
//!   statement; [`QUEUE`](batcher::QUEUE) callers waiting to be gathered, and at most
//!   two batches' worth gathered but deferred (duplicates, or past the bytes); a caller
//!   finding the queue full waits for room (and for the engine's store timeout). A
//!   caller that gave up before its statement was sent is not run. One statement at a
//!   time per batcher, each bounded by [`BATCH_TIMEOUT`].
//!
//! Each batcher is a task, spawned on the runtime the store was opened in, that borrows a
//! statement connection (`connections.rs`) per batch and ends when the last clone of the
//! store is dropped; if it is gone (that runtime shut down), claims and completions fail
//! with an error, never a silent success.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnection, PgRow};
use sqlx::{Row, SqlStr};

use super::connections::{StatementConnection, StatementConnections};
use crate::store::sql::batcher::{self, MAX_BATCH, Waiting};

/// Bytes of responses per completion statement at most (a first element is always
/// taken): far below Postgres's 1 GiB limit on one `bytea[]` value.
pub(super) const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// How long one batch may take to get its connection and run its statement: a
/// connection whose server stopped answering must not hold up every claim for as long
/// as TCP takes to give up.
pub(super) const BATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// One caller's answer.
type Answer<B> = batcher::Answer<<B as Batch>::Reply>;

/// One caller's item and where its answer goes.
type Queued<B> = batcher::Queued<B, <B as Batch>::Reply>;

/// The sending side of one batcher task; clones send to the same task, which ends when
/// the last clone is dropped.
pub(super) type Batcher<B> = batcher::Batcher<B, <B as Batch>::Reply>;

/// What one batcher batches: claims or completions.
pub(super) trait Batch: Send + Sync + Sized + 'static {
    /// What each caller gets back.
    type Reply: Send + 'static;

    /// The record it is about: `(scope, key)`, distinct within a batch.
    fn record(&self) -> (&str, &str);

    /// The bytes it adds to a statement, counted against [`MAX_BATCH_BYTES`].
    fn bytes(&self) -> usize {
        0
    }

    /// The answer of `self`, which came in the same batch as `first` for the same
    /// record, as if it had run right after `first` answered `first_reply`; `None`: it
    /// runs in the next batch instead.
    fn after_first(&self, first: &Self, first_reply: &Self::Reply) -> Option<Self::Reply>;

    /// Runs `batch` (sorted by record, records distinct) as one statement on `db`;
    /// exactly one reply per element, in order. `Err`: the statement failed, nothing of
    /// it was committed.
    fn run<'c>(
        statement: &'c SqlStr,
        db: &'c mut PgConnection,
        batch: &'c [&'c Self],
    ) -> impl Future<Output = Result<Vec<Answer<Self>>, sqlx::Error>> + Send + 'c;
}

/// The position in its batch (0-based) of the element a batch statement's row is about:
/// its `n` column, the 1-based ordinality of the statement's arrays.
pub(super) fn element_of(row: &PgRow, batch_len: usize) -> Result<usize, sqlx::Error> {
    let n: i64 = row.try_get("n")?;
    usize::try_from(n - 1)
        .ok()
        .filter(|&at| at < batch_len)
        .ok_or_else(|| sqlx::Error::Protocol(format!("a row for element {n} of {batch_len}")))
}

/// Spawns the batcher for `statement` on the current runtime.
pub(super) fn start<B: Batch>(
    statement: SqlStr,
    connections: Arc<StatementConnections>,
) -> Batcher<B> {
    let (batcher, waiting) =
        Batcher::channel("the Postgres store's group commit task is gone (its runtime shut down)");
    tokio::spawn(serve(statement, connections, waiting));
    batcher
}

/// The batcher's loop: gathers a batch, runs it, answers it; until every sender is gone.
async fn serve<B: Batch>(
    statement: SqlStr,
    connections: Arc<StatementConnections>,
    mut waiting: Waiting<B, B::Reply>,
) {
    // Items taken from the queue but left for a later batch (duplicates whose answer
    // could not be derived, or past the statement's bytes): they go first next time.
    let mut deferred: VecDeque<Queued<B>> = VecDeque::new();
    let mut arrived: Vec<Queued<B>> = Vec::with_capacity(MAX_BATCH);
    let mut batch: Vec<Queued<B>> = Vec::with_capacity(MAX_BATCH);
    loop {
        if deferred.is_empty() {
            if !waiting.recv(&mut arrived).await {
                return;
            }
            deferred.extend(arrived.drain(..));
        }
        // Duplicates of a record already in the batch, in arrival order.
        let mut duplicates = Vec::new();
        let mut bytes = 0;
        while batch.len() < MAX_BATCH && duplicates.len() < MAX_BATCH {
            let Some(next) = deferred.pop_front().or_else(|| waiting.try_next()) else {
                break;
            };
            if next.gave_up() {
                // Its caller gave up (the engine's store timeout): nobody would act on it.
                continue;
            }
            if batch.iter().any(|b| b.item.record() == next.item.record()) {
                duplicates.push(next);
                continue;
            }
            if !batch.is_empty() && bytes + next.item.bytes() > MAX_BATCH_BYTES {
                deferred.push_front(next);
                break;
            }
            bytes += next.item.bytes();
            batch.push(next);
        }
        if batch.is_empty() {
            continue;
        }
        let replies = run_batch(&statement, &connections, &mut batch).await;
        // Derived from the batch's answers, but sent after them: a duplicate that waits
        // then finds its first registered as running in this process.
        let mut later = VecDeque::new();
        let mut derived = Vec::new();
        for duplicate in duplicates {
            let answer = replies.as_ref().and_then(|replies| {
                let first = batch
                    .iter()
                    .position(|b| b.item.record() == duplicate.item.record())?;
                let Ok(first_reply) = &replies[first] else {
                    return None;
                };
                duplicate.item.after_first(&batch[first].item, first_reply)
            });
            match answer {
                Some(reply) => derived.push((duplicate, reply)),
                None => later.push_back(duplicate),
            }
        }
        answer_all(&mut batch, replies);
        for (duplicate, reply) in derived {
            duplicate.answer(Ok(reply));
        }
        later.extend(deferred.drain(..));
        deferred = later;
    }
}

/// Sends each caller of `batch` its answer (nothing when `replies` is `None`: they
/// have had their errors); leaves `batch` empty.
fn answer_all<B: Batch>(batch: &mut Vec<Queued<B>>, replies: Option<Vec<Answer<B>>>) {
    let Some(replies) = replies else { return };
    for (queued, reply) in batch.drain(..).zip(replies) {
        queued.answer(reply);
    }
}

/// Runs one batch (sorted by record first, callers that gave up left out); its
/// answers, one per element of `batch` as it then is, or `None` when it failed and every
/// caller in it has been answered with an error (`batch` is then empty).
async fn run_batch<B: Batch>(
    statement: &SqlStr,
    connections: &StatementConnections,
    batch: &mut Vec<Queued<B>>,
) -> Option<Vec<Answer<B>>> {
    // One lock order for every batch (see the module docs).
    batch.sort_unstable_by(|a, b| a.item.record().cmp(&b.item.record()));
    let mut result = run_together(statement, connections, batch).await;
    if matches!(&result, Err(error) if worth_running_again(error)) {
        result = run_together(statement, connections, batch).await;
    }
    match result {
        Ok(replies) => Some(replies),
        // The server refused the statement, so nothing of it was committed; only one
        // element may be at fault.
        Err(error) if batch.len() > 1 && error.as_database_error().is_some() => {
            tracing::debug!(%error, items = batch.len(), "a group commit statement was refused; running its items one by one");
            let mut replies = Vec::with_capacity(batch.len());
            for queued in batch.iter() {
                let alone = timed(async {
                    let lent = connections.acquire().await?;
                    run_on(statement, lent, &[&queued.item]).await
                })
                .await;
                replies.push(match alone {
                    Ok(mut reply) => reply.pop().expect("one reply for one item"),
                    Err(error) => Err(error.into()),
                });
            }
            Some(replies)
        }
        Err(error) => {
            batcher::fail_all(batch, FAILED, Vec::new(), error);
            None
        }
    }
}

/// `batch` as one statement; callers that gave up while the connection was awaited are
/// left out of it (and of `batch`).
async fn run_together<B: Batch>(
    statement: &SqlStr,
    connections: &StatementConnections,
    batch: &mut Vec<Queued<B>>,
) -> Result<Vec<Answer<B>>, sqlx::Error> {
    timed(async {
        let lent = connections.acquire().await?;
        batch.retain(|queued| !queued.gave_up());
        if batch.is_empty() {
            lent.release();
            return Ok(Vec::new());
        }
        let items: Vec<&B> = batch.iter().map(|queued| &queued.item).collect();
        run_on(statement, lent, &items).await
    })
    .await
}

/// Runs `items` on `lent`, giving it back only after a clean finish.
async fn run_on<B: Batch>(
    statement: &SqlStr,
    mut lent: StatementConnection<'_>,
    items: &[&B],
) -> Result<Vec<Answer<B>>, sqlx::Error> {
    let replies = B::run(statement, lent.connection(), items).await?;
    lent.release();
    if replies.len() != items.len() {
        return Err(sqlx::Error::Protocol(format!(
            "a batch of {} got {} answers",
            items.len(),
            replies.len()
        )));
    }
    Ok(replies)
}

/// `work` within [`BATCH_TIMEOUT`]; past it, dropped (its connection closed) and an
/// I/O error.
async fn timed<T>(work: impl Future<Output = Result<T, sqlx::Error>>) -> Result<T, sqlx::Error> {
    tokio::time::timeout(BATCH_TIMEOUT, work)
        .await
        .unwrap_or_else(|_| {
            Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "a group commit statement did not finish within {}s",
                    BATCH_TIMEOUT.as_secs()
                ),
            )))
        })
}

/// A deadlock or serialization failure: the server rolled the statement back, and the
/// same statement may well succeed now.
fn worth_running_again(error: &sqlx::Error) -> bool {
    let code = error.as_database_error().and_then(|e| e.code());
    matches!(code.as_deref(), Some("40P01" | "40001"))
}

/// What each caller of a batch whose statement failed is told.
const FAILED: &str = "the batch statement this claim or completion was part of failed";
