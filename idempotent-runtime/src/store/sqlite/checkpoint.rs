//! Checkpoints off the write path.
//!
//! In WAL mode every commit appends pages to the WAL, and the WAL is copied back into
//! the database file by a checkpoint. By default SQLite runs that checkpoint inside the
//! commit that takes the WAL past 1,000 pages, with an fsync of the WAL and one of the
//! database even at `synchronous = NORMAL`: with group commit, a whole batch of claims
//! and completions would wait for it. What the checkpointer buys: no batch of the writer
//! ever waits for a checkpoint's copying and fsyncs. The store's writer
//! turns that off on its own connection (`wal_autocheckpoint = 0`, see [`WRITER_SETUP`])
//! and this task checkpoints instead, on a pool connection, [`DELAY`] after the writer
//! began a batch: `PASSIVE`, so it waits for no reader or writer and none waits for it.
//! Durability is unchanged: a commit is as durable as the WAL write it always was.
//!
//! The task ends when the writer does (the last clone of the store dropped): the writer
//! holds the only sender of its wake-ups. The pool's other connections (an app's own
//! writes, transactional handlers) keep SQLite's automatic checkpoints.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::SqlitePool;
use tokio::sync::mpsc;

/// Run on the writer's connection when it takes it: its commits never checkpoint.
pub(super) const WRITER_SETUP: &str = "PRAGMA wal_autocheckpoint = 0";

/// How long after a batch began the checkpoint runs: the WAL pages of the writes in
/// between are copied by one checkpoint (about as many as SQLite's own threshold of
/// 1,000 pages at some thousands of writes a second), and an idle store runs none.
pub(super) const DELAY: Duration = Duration::from_millis(200);

/// The writer's side: tells the checkpointer that the WAL is growing.
#[derive(Debug)]
pub(super) struct Checkpointer {
    wake: mpsc::Sender<()>,
}

/// Checkpoints run so far, for [`GroupCommitStats`](super::GroupCommitStats).
#[derive(Debug, Default)]
pub(super) struct Checkpoints {
    done: AtomicU64,
    failed: AtomicU64,
}

impl Checkpoints {
    /// Checkpoints that ran (every frame they could copy, copied).
    pub(super) fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Checkpoints that failed (tried again after the next batch).
    pub(super) fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

impl Checkpointer {
    /// Starts the checkpointer on the current Tokio runtime, checkpointing through
    /// `pool`; counts into `counts`.
    pub(super) fn start(pool: SqlitePool, counts: Arc<Checkpoints>) -> Self {
        // One wake-up waiting is enough: the checkpoint it starts covers every batch
        // begun before it.
        let (wake, woken) = mpsc::channel(1);
        tokio::spawn(run(pool, woken, counts));
        Self { wake }
    }

    /// A batch of writes is about to run.
    pub(super) fn batch_begins(&self) {
        // Full: a checkpoint is already due, and it will cover this batch.
        let _ = self.wake.try_send(());
    }
}

async fn run(pool: SqlitePool, mut woken: mpsc::Receiver<()>, counts: Arc<Checkpoints>) {
    while woken.recv().await.is_some() {
        tokio::time::sleep(DELAY).await;
        // Batches begun during the delay have committed (or will have been counted by a
        // wake-up still waiting, which runs the next checkpoint).
        while woken.try_recv().is_ok() {}
        let checkpoint = sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_one(&pool)
            .await;
        match checkpoint {
            Ok(_) => counts.done.fetch_add(1, Ordering::Relaxed),
            Err(error) => {
                // Nothing is lost: the frames stay in the WAL for the next checkpoint.
                tracing::warn!(%error, "an SQLite WAL checkpoint failed; the next batch of writes retries it");
                counts.failed.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}
