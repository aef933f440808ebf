//! Group read: the reads of records (`records.rs`), batched by one reader task on a
//! connection of its own (`dedicated.rs`), as the writer batches the writes.
//!
//! Every claim reads its record first: a fresh key to find none, a replay the cache does
//! not hold to find its response. What batching buys: through sqlx each read is a
//! hand-off to the connection's thread and back, and each autocommitted read locks and
//! unlocks the WAL's read mark and finds its page cache stale after any commit of the
//! writer's; here the reads waiting, up to the batcher's `MAX_BATCH`, run one
//! after another in a single hand-off, in one read transaction: one snapshot, taken at
//! the batch's first read, after every read of the batch was sent, so each sees what
//! was committed when its caller asked, or later (WAL: it waits for no writer). A read
//! that fails fails alone.

use std::sync::Arc;

use sqlx::SqlitePool;

use super::dedicated::{self, Batch, BatchEnd, Batches};
use super::lease_time::Now;
use super::raw_connection::{Param, RawConnection};
use super::records::{READ, record_at};
use crate::clock::Clock;
use crate::store::sql::batcher::Batcher;
use crate::store::{Record, StoreError};

/// One read: the record of (scope, key), and the store clock's now as it is read.
#[derive(Debug)]
pub(super) struct RecordRead {
    scope: String,
    key: String,
    clock: Arc<dyn Clock>,
}

/// The handle claims send their reads through; clones share the one reader.
#[derive(Debug, Clone)]
pub(super) struct GroupRead {
    reader: Batcher<RecordRead, (Option<Record>, Now)>,
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

    /// Reads the record of (`scope`, `key`) in the next batch, and `clock`'s now as it
    /// was read (its lease placed on that now's lease clock).
    pub(super) async fn read(
        &self,
        scope: &str,
        key: &str,
        clock: &Arc<dyn Clock>,
    ) -> Result<(Option<Record>, Now), StoreError> {
        let read = RecordRead {
            scope: scope.to_owned(),
            key: key.to_owned(),
            clock: clock.clone(),
        };
        self.reader.ask(read).await
    }
}

/// The reader's work.
struct Reader;

impl Batches for Reader {
    type Item = RecordRead;
    type Reply = (Option<Record>, Now);

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
            let params = [Param::Text(&read.scope), Param::Text(&read.key)];
            let now = Now::of(read.clock.as_ref());
            let found = match db.query_row(READ, &params, |row| record_at(row, 0, now)) {
                Ok(found) => found.transpose().map(|record| (record, now)),
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
