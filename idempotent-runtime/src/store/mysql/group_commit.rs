//! Group commit on MySQL: concurrent inserts, and concurrent completions, each batched into
//! one request to the server — one round trip for the batch, and for completions one
//! transaction (one redo-log flush).
//!
//! A caller sends its insert (or completion) with a reply channel to the store's batcher
//! for it (the batcher skeleton, `store/sql/batcher.rs`); the batcher takes every item
//! waiting, up to [`MAX_BATCH`], and sends them as one text-protocol request of several
//! statements (sqlx connects with `CLIENT_MULTI_STATEMENTS`): the server runs them one
//! after the other and answers with one result per statement, all in one exchange. While
//! one batch runs, the next one gathers: batches grow with the load, with no added wait
//! when there is none (a lone insert runs at once, as a batch of one).
//!
//! Why the text protocol: a prepared statement holds exactly one statement, so an insert
//! (the `INSERT IGNORE`, then the read that says what it found) would be two round trips. Every
//! value is written into the text as a hexadecimal literal (`X'…'`) or a decimal
//! integer ([`hex`]), never as quoted text, so no value can change the statement.
//!
//! The statements are the register's own, element by element: an insert unless present,
//! a compare-and-set on the version; nothing is decided here. What every element keeps:
//!
//! - **Durable before answered.** Each statement autocommits (the completions' one
//!   transaction commits) before the reply comes back.
//! - **The same effect as alone.** Each element is the statement it would be alone;
//!   elements are sorted by record (`scope_key_sha256`), so batches of different
//!   instances lock rows in one order.
//! - **A lock conflict runs again.** A batch InnoDB rolled back on a deadlock or a lock
//!   wait timeout committed nothing: it is sent again by the rule every write follows
//!   (`lock_conflict.rs`).
//! - **One element the server refuses fails alone.** Any other error the server reported
//!   runs the elements one batch of one each, so only the one at fault gets its error.
//! - **A lost connection fails its batch.** An I/O error or [`BATCH_TIMEOUT`](batcher::BATCH_TIMEOUT) answers
//!   every caller of the batch with an error (`503`) and closes the connection; the next
//!   batch takes another. Such a batch is not run again: it may have committed.
//!
//! Each batcher is a task, spawned on the runtime the store was opened in, that keeps one
//! connection of its own — taken from the store's pool and detached from it, so the pool's
//! setup applies and sqlx's ping of every connection handed back to a pool (a round trip)
//! does not — and ends when the last clone of the store is dropped; if it is gone (that
//! runtime shut down), inserts and completions fail with an error, never a silent success.

use std::fmt::Write as _;
use std::future::Future;
use std::time::Duration;

use futures_util::TryStreamExt;
use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlQueryResult, MySqlRow};
use sqlx::{AssertSqlSafe, Either, Executor, MySql};
use tokio::time::Instant;

use super::lock_conflict::{Resends, is_lock_conflict};
use crate::store::sql::batcher::{self, Gathered, MAX_BATCH, Waiting, one_each, timed};

/// Bytes of responses per completion request at most; a response larger than this does
/// not join a batch. Each byte travels as two hexadecimal digits, so a request stays well
/// within the server's `max_allowed_packet` (16 MiB by default on MariaDB, 64 MiB on
/// MySQL 8).
pub(super) const MAX_BATCH_BYTES: usize = 512 * 1024;

/// A connection idle this long is closed and replaced before its next batch, rather than
/// risking one the server closed meanwhile (`wait_timeout`).
const IDLE_LIMIT: Duration = Duration::from_secs(60);

/// One caller's answer.
pub(super) type Answer<B> = batcher::Answer<<B as Batch>::Reply>;

/// One caller's item and where its answer goes.
type Queued<B> = batcher::Queued<B, <B as Batch>::Reply>;

/// The sending side of one batcher task; clones send to the same task, which ends when
/// the last clone is dropped.
pub(super) type Batcher<B> = batcher::Batcher<B, <B as Batch>::Reply>;

/// What one batcher batches: inserts or completions. Their [`Gathered::record`] is the
/// record's `scope_key_sha256`; a batch may hold two elements for one record (its
/// statements run one after the other).
pub(super) trait Batch: Gathered + Send + Sync + Sized + 'static {
    /// What each caller gets back.
    type Reply: Clone + Send + 'static;

    /// Runs `batch` (sorted by record) as one request on `db`; exactly one reply per
    /// element, in order. `Err`: a statement failed; what it did is rolled back, and
    /// the connection is not used again.
    fn run<'c>(
        db: &'c mut MySqlConnection,
        batch: &'c [&'c Self],
    ) -> impl Future<Output = Result<Vec<Answer<Self>>, sqlx::Error>> + Send + 'c;
}

/// A value written into a batch request's text.
#[derive(Debug, Clone, Copy)]
pub(super) enum Value<'a> {
    /// A binary string, written as a hexadecimal literal: `X'…'`.
    Bytes(&'a [u8]),
    /// An integer, written in decimal.
    Int(i64),
    /// `NULL`.
    Null,
}

/// `statement` (one of the store's `.sql` files) with its comment lines left out and
/// each `?` replaced by the next of `values`, in order, as a literal. The statements
/// this is used on have no `?` but their placeholders (no quoted text holds one).
pub(super) fn inline(statement: &str, values: &[Value<'_>]) -> String {
    let mut sql = String::with_capacity(statement.len() + 64 * values.len());
    let mut values = values.iter();
    for line in statement
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"))
    {
        let mut parts = line.split('?');
        if let Some(first) = parts.next() {
            sql.push_str(first);
        }
        for part in parts {
            match values.next().expect("a value for every placeholder") {
                Value::Bytes(bytes) => hex(&mut sql, bytes),
                // In parentheses when negative, so a `-` before the placeholder never
                // makes a `--` comment.
                Value::Int(n) if *n < 0 => {
                    let _ = write!(sql, "({n})");
                }
                Value::Int(n) => {
                    let _ = write!(sql, "{n}");
                }
                Value::Null => sql.push_str("NULL"),
            }
            sql.push_str(part);
        }
        sql.push('\n');
    }
    assert!(values.next().is_none(), "a placeholder for every value");
    sql
}

/// Writes `bytes` to `sql` as a hexadecimal literal: `X'…'`.
fn hex(sql: &mut String, bytes: &[u8]) {
    sql.push_str("X'");
    for byte in bytes {
        let _ = write!(sql, "{byte:02X}");
    }
    sql.push('\'');
}

/// Sends `statements` (one text-protocol request) on `db` — a batcher's connection, or
/// and collects every result: one `Left` per
/// statement, after the rows (`Right`) of a `SELECT`.
pub(super) async fn run_request<'e>(
    db: impl Executor<'e, Database = MySql>,
    statements: String,
) -> Result<Vec<Either<MySqlQueryResult, MySqlRow>>, sqlx::Error> {
    sqlx::raw_sql(AssertSqlSafe(statements))
        .fetch_many(db)
        .try_collect()
        .await
}

/// Spawns the batcher for `B` on the current runtime; its connection comes from `pool`.
pub(super) fn start<B: Batch>(pool: MySqlPool) -> Batcher<B> {
    let (batcher, waiting) =
        Batcher::channel("the MySQL store's group commit task is gone (its runtime shut down)");
    tokio::spawn(serve(BatchConnection { pool, open: None }, waiting));
    batcher
}

/// The batcher's own connection, opened on first use and after a failure.
struct BatchConnection {
    pool: MySqlPool,
    /// The connection and when its last batch finished.
    open: Option<(MySqlConnection, Instant)>,
}

impl BatchConnection {
    /// Runs `batch` on the connection, opening one first if there is none; keeps the
    /// connection only when the request finished cleanly.
    async fn run<B: Batch>(&mut self, batch: &[&B]) -> Result<Vec<Answer<B>>, sqlx::Error> {
        let work = async {
            let mut db = match self.open.take() {
                Some((db, since)) if since.elapsed() < IDLE_LIMIT => db,
                // Closed politely in the background; a dead one just drops.
                stale => {
                    if let Some((db, _)) = stale {
                        tokio::spawn(sqlx::Connection::close(db));
                    }
                    self.pool.acquire().await?.detach()
                }
            };
            let replies = B::run(&mut db, batch).await?;
            self.open = Some((db, Instant::now()));
            Ok(replies)
        };
        one_each(batch.len(), timed(work).await?)
    }
}

/// The batcher's loop: gathers a batch, runs it, answers it; until every sender is gone.
async fn serve<B: Batch>(mut db: BatchConnection, mut waiting: Waiting<B, B::Reply>) {
    let mut batch: Vec<Queued<B>> = Vec::with_capacity(MAX_BATCH);
    while waiting.next_batch(&mut batch, MAX_BATCH_BYTES).await {
        run_batch(&mut db, &mut batch).await;
    }
}

/// Runs one batch and answers each of its callers; leaves `batch` empty.
async fn run_batch<B: Batch>(db: &mut BatchConnection, batch: &mut Vec<Queued<B>>) {
    let items: Vec<&B> = batch.iter().map(|queued| &queued.item).collect();
    let error = match send(db, &items).await {
        Ok(replies) => {
            drop(items);
            for (queued, reply) in batch.drain(..).zip(replies) {
                queued.answer(reply);
            }
            return;
        }
        Err(error) => error,
    };
    drop(items);
    if error.as_database_error().is_none() {
        batcher::fail_all(batch, FAILED, Vec::new(), error);
        return;
    }
    // Rolled back each time `send` sent it.
    if is_lock_conflict(&error) {
        batcher::fail_all(batch, FAILED, Vec::new(), error);
        return;
    }
    // The server refused a statement, so nothing of the batch took effect; only one
    // element may be at fault.
    tracing::debug!(%error, items = batch.len(), "a group commit request was refused; running its items one by one");
    for queued in batch.drain(..) {
        let reply = match send(db, &[&queued.item]).await {
            Ok(mut reply) => reply.pop().expect("one reply for one item"),
            Err(error) => Err(error.into()),
        };
        queued.answer(reply);
    }
}

/// Runs `batch` on `db`, sent again while InnoDB rolls it back for a lock conflict
/// (`lock_conflict.rs`).
async fn send<B: Batch>(
    db: &mut BatchConnection,
    batch: &[&B],
) -> Result<Vec<Answer<B>>, sqlx::Error> {
    let mut resends = Resends::new("a batch of inserts or completions");
    loop {
        let answer = db.run(batch).await;
        if !resends.again(&answer) {
            return answer;
        }
        tokio::time::sleep(resends.pause()).await;
    }
}

/// What each caller of a batch whose request failed is told.
const FAILED: &str = "the batch request this insert or completion was part of failed";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_as_literals_that_cannot_change_the_statement() {
        let sql = inline(
            "-- a comment with a ? in it\nSELECT ?, ?,\n  ?, ? FROM t\n",
            &[
                Value::Bytes(b"a'; --\\"),
                Value::Bytes(b""),
                Value::Int(i64::MIN),
                Value::Null,
            ],
        );
        assert_eq!(
            sql,
            "SELECT X'61273B202D2D5C', X'',\n  (-9223372036854775808), NULL FROM t\n"
        );
    }

    #[test]
    #[should_panic(expected = "a value for every placeholder")]
    fn a_missing_value_is_a_bug_not_a_statement() {
        inline("SELECT ?, ?", &[Value::Int(1)]);
    }
}
