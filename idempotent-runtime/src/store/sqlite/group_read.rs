//! Group read: the claims' reads (`claim_read.sql`), batched by one reader task on a
//! connection of its own (`dedicated.rs`), as the writer batches the writes.
//!
//! Every claim reads its record first: a fresh key to find none, a replay the cache does
//! not hold to find its response. What batching buys: through sqlx each read is a
//! hand-off to the connection's thread and back, and each autocommitted read locks and
//! unlocks the WAL's read mark and finds its page cache stale after any commit of the
//! writer's; here the reads waiting, up to the batcher's `MAX_BATCH`, run one
//! after another in a single hand-off, in one read transaction: one snapshot, taken at
//! the batch's first read, after every read of the batch was sent, so each sees what
//! was committed when its claim asked, or later (WAL: it waits for no writer). A read
//! that fails fails alone.

use sqlx::SqlitePool;

use super::dedicated::{self, Batch, BatchEnd, Batches};
use super::group_commit::boot_param;
use super::lease_time::{Now, statement};
use super::raw_connection::{Param, RawConnection, Row};
use crate::store::StoreError;
use crate::store::sql::FoundRow;
use crate::store::sql::batcher::Batcher;

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

/// The handle claims send their reads through; clones share the one reader.
#[derive(Debug, Clone)]
pub(super) struct GroupRead {
    reader: Batcher<ClaimRead, Option<FoundRow>>,
}

impl GroupRead {
    /// Starts the reader on the current Tokio runtime, reading through `pool`.
    pub(super) fn start(pool: SqlitePool) -> Self {
        let (reader, waiting) = Batcher::channel(
            "the SQLite store's reader did not answer (it stopped, or its batch failed unexpectedly); the record was not read",
        );
        tokio::spawn(dedicated::serve(pool, Reader, waiting));
        Self { reader }
    }

    /// Runs `read` in the next batch; the record found, if any.
    pub(super) async fn read(&self, read: ClaimRead) -> Result<Option<FoundRow>, StoreError> {
        self.reader.ask(read).await
    }
}

/// The reader's work.
struct Reader;

impl Batches for Reader {
    type Item = ClaimRead;
    type Reply = Option<FoundRow>;

    const FAILED: &'static str = "the SQLite store's reader has no connection";

    async fn prepare(&self, batch: &mut Batch<Self>) {
        // A caller that gave up (the engine's store timeout) needs no answer.
        batch.retain(|pending| !pending.gave_up());
    }

    fn run(db: &mut RawConnection, batch: &mut Batch<Self>) -> BatchEnd {
        // Several reads share one read transaction (see the module docs). If it cannot
        // begin, each read runs alone, as a batch of one does.
        let shared = batch.len() > 1 && db.execute(dedicated::BEGIN, &[]).is_ok();
        for pending in batch.drain(..) {
            let read = &pending.item;
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
            pending.answer(found);
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
