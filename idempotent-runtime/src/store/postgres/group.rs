//! Group commit on Postgres: concurrent inserts, and concurrent completions (the
//! `Complete` compare-and-set), each gathered into one statement — one round trip, one
//! transaction, one WAL flush for the batch.
//!
//! On a fresh key the fixed costs of a statement (a protocol exchange, a transaction, a
//! wake-up of the backend, a commit's flush) are most of the server's work. A caller
//! sends its insert (or completion) to the store's task for that statement (the batcher
//! skeleton, `store/sql/batcher.rs`), which takes every one waiting, up to
//! [`MAX_BATCH`], runs them as one statement (`sql/insert.sql`, `sql/complete.sql`:
//! arrays in, one row per element out) and answers each caller once it returned, an
//! autocommitted transaction. While one batch runs the next gathers, so batches grow with
//! the load and a lone operation runs at once, as a batch of one. The statements are the
//! register's own, element by element: an insert unless present, a compare-and-set on
//! the version; nothing is decided here.
//!
//! - **Durable before answered**: the reply follows the statement's commit.
//! - **One element per record**: a second operation on a record already in the batch
//!   waits for the next one, so it sees the first's effect. Elements are sorted by record,
//!   so two batches lock rows in one order.
//! - **One element the server refuses fails alone**: a refused statement committed
//!   nothing, and its elements then run one statement each; a deadlock or serialization
//!   failure runs it once more first.
//! - **A lost connection fails its batch**: an I/O error or [`BATCH_TIMEOUT`](batcher::BATCH_TIMEOUT) answers
//!   every caller with an error (`503`) and closes the connection; the batch is not run
//!   again, since it may have committed.
//! - **Bounded**: [`MAX_BATCH`] elements and [`MAX_BATCH_BYTES`] of responses per
//!   statement; callers that gave up before their statement was sent are left out.

use std::future::Future;
use std::sync::Arc;

use sqlx::postgres::{PgConnection, PgRow};
use sqlx::{Row, SqlStr};

use super::connections::StatementConnections;
use crate::store::sql::batcher::{self, Gathered, MAX_BATCH, Waiting, one_each, timed};

/// Bytes of responses per statement at most (a first element is always taken): far
/// below Postgres's 1 GiB limit on one `bytea[]` value.
const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;

type Answer<B> = batcher::Answer<<B as Batch>::Reply>;
type Queued<B> = batcher::Queued<B, <B as Batch>::Reply>;

/// The sending side of one batching task, which ends when the last clone is dropped.
pub(super) type Batcher<B> = batcher::Batcher<B, <B as Batch>::Reply>;

/// What one task batches: inserts or completions, one element per record
/// ([`Gathered::ONE_PER_RECORD`]: the statement's arrays take each record once).
pub(super) trait Batch: Gathered + Send + Sync + Sized + 'static {
    /// What each caller gets back.
    type Reply: Send + 'static;

    /// Runs `batch` (records distinct) as `statement` on `db`: one reply per element, in
    /// order. `Err`: the statement failed, nothing of it was committed.
    fn run<'c>(
        statement: &'c SqlStr,
        db: &'c mut PgConnection,
        batch: &'c [&'c Self],
    ) -> impl Future<Output = Result<Vec<Answer<Self>>, sqlx::Error>> + Send + 'c;
}

/// The element (0-based) a statement's row answers: its `n`, the arrays' 1-based
/// ordinality.
pub(super) fn element_of(row: &PgRow, batch_len: usize) -> Result<usize, sqlx::Error> {
    let n: i64 = row.try_get("n")?;
    usize::try_from(n - 1)
        .ok()
        .filter(|&at| at < batch_len)
        .ok_or_else(|| sqlx::Error::Protocol(format!("a row for element {n} of {batch_len}")))
}

/// Spawns the task batching `statement` on the current runtime.
pub(super) fn start<B: Batch>(
    statement: SqlStr,
    connections: Arc<StatementConnections>,
) -> Batcher<B> {
    let (batcher, waiting) =
        Batcher::channel("the Postgres store's group commit task is gone (its runtime shut down)");
    tokio::spawn(serve(statement, connections, waiting));
    batcher
}

/// Gathers a batch, runs it, answers it; until every sender is gone.
async fn serve<B: Batch>(
    statement: SqlStr,
    connections: Arc<StatementConnections>,
    mut waiting: Waiting<B, B::Reply>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while waiting.next_batch(&mut batch, MAX_BATCH_BYTES).await {
        run_batch(&statement, &connections, &mut batch).await;
    }
}

/// Runs one batch and answers every caller in it.
async fn run_batch<B: Batch>(
    statement: &SqlStr,
    connections: &StatementConnections,
    batch: &mut Vec<Queued<B>>,
) {
    let mut result = run_together(statement, connections, batch).await;
    if matches!(&result, Err(error) if worth_running_again(error)) {
        result = run_together(statement, connections, batch).await;
    }
    match result {
        Ok(replies) => {
            for (queued, reply) in batch.drain(..).zip(replies) {
                queued.answer(reply);
            }
        }
        // The server refused the statement, which committed nothing: only one element
        // may be at fault.
        Err(error) if batch.len() > 1 && error.as_database_error().is_some() => {
            tracing::debug!(%error, items = batch.len(), "a group commit statement was refused; running its items one by one");
            for queued in batch.drain(..) {
                let alone = timed(async {
                    let lent = connections.acquire().await?;
                    run_on(statement, lent, &[&queued.item]).await
                })
                .await;
                queued.answer(match alone {
                    Ok(mut reply) => reply.pop().expect("one reply for one item"),
                    Err(error) => Err(error.into()),
                });
            }
        }
        Err(error) => batcher::fail_all(batch, FAILED, Vec::new(), error),
    }
}

/// `batch` as one statement, without the callers that gave up while the connection was
/// awaited.
async fn run_together<B: Batch>(
    statement: &SqlStr,
    connections: &StatementConnections,
    batch: &mut Vec<Queued<B>>,
) -> Result<Vec<Answer<B>>, sqlx::Error> {
    timed(async {
        let lent = connections.acquire().await?;
        batch.retain(|queued| !queued.gave_up());
        let items: Vec<&B> = batch.iter().map(|queued| &queued.item).collect();
        if items.is_empty() {
            lent.release();
            return Ok(Vec::new());
        }
        run_on(statement, lent, &items).await
    })
    .await
}

/// Runs `items` on `lent`, giving it back only after a clean finish.
async fn run_on<B: Batch>(
    statement: &SqlStr,
    mut lent: super::connections::StatementConnection<'_>,
    items: &[&B],
) -> Result<Vec<Answer<B>>, sqlx::Error> {
    let replies = B::run(statement, lent.connection(), items).await?;
    lent.release();
    one_each(items.len(), replies)
}

/// A deadlock or serialization failure: the server rolled the statement back, and the
/// same statement may well succeed now.
fn worth_running_again(error: &sqlx::Error) -> bool {
    let code = error.as_database_error().and_then(|e| e.code());
    matches!(code.as_deref(), Some("40P01" | "40001"))
}

/// What each caller of a batch whose statement failed is told.
const FAILED: &str = "the batch statement this insert or completion was part of failed";
