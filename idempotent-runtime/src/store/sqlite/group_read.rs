//! Group read: the claims' reads (`claim_read.sql`), batched by one reader task on a
//! connection of its own (`dedicated.rs`), as the writer batches the writes.
//!
//! Every claim reads its record first: a fresh key to find none, a replay the cache does
//! not hold to find its response. Through sqlx each read was a hand-off to the
//! connection's thread and back; here the reads waiting, up to [`MAX_BATCH`], run one
//! after another in a single hand-off, in one read transaction: one snapshot, taken at
//! the batch's first read, after every read of the batch was sent, so each sees what
//! was committed when its claim asked, or later (WAL: it waits for no writer). A read
//! that fails fails alone.

use std::sync::Arc;

use sqlx::SqlitePool;
use tokio::sync::mpsc;

use super::dedicated::{self, BatchEnd, Batches, Reply};
use super::group_commit::boot_param;
use super::lease_time::{Now, statement};
use super::raw_connection::{Param, RawConnection, Row};
use crate::store::StoreError;
use crate::store::sql::FoundRow;

/// Reads per batch at most.
const MAX_BATCH: usize = 64;

/// Reads waiting for the reader at most; callers beyond it wait for room.
const QUEUE: usize = 1024;

/// One claim's read: the record of (scope, key), judged at `now` against the claim's
/// fingerprint (the parameters of `claim_read.sql`).
#[derive(Debug)]
pub(super) struct ClaimRead {
    pub(super) scope: String,
    pub(super) key: String,
    pub(super) now: Now,
    pub(super) fingerprint: [u8; 32],
    pub(super) fingerprint_version: i64,
}

/// A read waiting for its batch, and where its answer goes.
#[derive(Debug)]
pub(super) struct PendingRead {
    read: ClaimRead,
    reply: Reply<Option<FoundRow>>,
}

/// The handle claims send their reads through; clones share the one reader.
#[derive(Debug, Clone)]
pub(super) struct GroupRead {
    queue: mpsc::Sender<PendingRead>,
}

impl GroupRead {
    /// Starts the reader on the current Tokio runtime, reading through `pool`.
    pub(super) fn start(pool: SqlitePool) -> Self {
        let (queue, waiting) = mpsc::channel(QUEUE);
        tokio::spawn(dedicated::serve(pool, Reader, waiting, MAX_BATCH));
        Self { queue }
    }

    /// Runs `read` in the next batch; the record found, if any.
    pub(super) async fn read(&self, read: ClaimRead) -> Result<Option<FoundRow>, StoreError> {
        dedicated::ask(
            &self.queue,
            |reply| PendingRead { read, reply },
            "the SQLite store's reader did not answer (it stopped, or its batch failed unexpectedly); the record was not read",
        )
        .await
    }
}

/// The reader found no connection to read on.
#[derive(Debug, thiserror::Error)]
#[error("the SQLite store's reader has no connection: {0}")]
struct NoConnection(#[source] Arc<sqlx::Error>);

/// The reader's work.
struct Reader;

impl Batches for Reader {
    type Item = PendingRead;

    async fn prepare(&self, batch: &mut Vec<PendingRead>) {
        // A caller that gave up (the engine's store timeout) needs no answer.
        batch.retain(|pending| !pending.reply.is_closed());
    }

    fn run(db: &mut RawConnection, batch: &mut Vec<PendingRead>) -> BatchEnd {
        // Several reads share one read transaction: one snapshot, one set of WAL locks
        // and one check of the page cache per batch, instead of per read (each
        // autocommitted read locks and unlocks the WAL's read mark, and finds its cache
        // stale after any commit of the writer's). The snapshot is taken at the batch's
        // first read, after every read of the batch was sent: each still sees what was
        // committed when its claim asked, or later. If it cannot begin, each read runs
        // alone, as a batch of one does.
        let shared = batch.len() > 1 && db.execute(dedicated::BEGIN, &[]).is_ok();
        for PendingRead { read, reply } in batch.drain(..) {
            let params = [
                Param::Text(&read.scope),
                Param::Text(&read.key),
                Param::Int(read.now.wall),
                Param::Blob(&read.fingerprint),
                Param::Int(read.fingerprint_version),
                boot_param(read.now.boot_id.as_ref()),
                Param::Int(read.now.boot),
            ];
            let found = match db.query_row(statement!("sql/claim_read.sql"), &params, found_row) {
                Ok(found) => found.transpose(),
                Err(failure) => Err(StoreError::Database(failure.into_sqlx())),
            };
            // A caller that stopped waiting no longer needs the answer.
            let _ = reply.send(found);
        }
        if shared && db.execute(dedicated::COMMIT, &[]).is_err() {
            // Nothing was written: whatever the read transaction's end says, the reads
            // stand; the connection is fit again once no transaction is open.
            return dedicated::end_transaction(db);
        }
        // No transaction left open (and each batch begins by ending one the connection
        // came with).
        BatchEnd::Clean
    }

    fn fail(batch: &mut Vec<PendingRead>, error: sqlx::Error) {
        let error = Arc::new(error);
        for pending in batch.drain(..) {
            let _ = pending
                .reply
                .send(Err(StoreError::backend(NoConnection(Arc::clone(&error)))));
        }
    }
}

/// The columns of `claim_read.sql`, in its order.
fn found_row(row: &Row<'_>) -> Result<FoundRow, StoreError> {
    let flag = |column, name: &str| {
        row.int(column)
            .map(|value| value != 0)
            .ok_or_else(|| StoreError::Corrupt(format!("the record's {name} is NULL")))
    };
    let state = row
        .bytes(0)
        .ok_or_else(|| StoreError::Corrupt("the record has no state".to_owned()))?;
    Ok(FoundRow {
        state: String::from_utf8(state)
            .map_err(|_| StoreError::Corrupt("the record's state is not UTF-8".to_owned()))?,
        ttl_ran_out: flag(1, "expiry")?,
        lease_ran_out: flag(2, "lease")?,
        same_fingerprint: flag(3, "fingerprint")?,
        lease_remaining_ms: row.int(4),
        ttl_remaining_ms: row.int(5),
        status: row.int(6),
        headers: row.bytes(7),
        body: row.bytes(8),
    })
}
