//! The batcher skeleton every batching SQL store task shares: callers queue an item with a
//! reply channel and wait; one task takes what is waiting, runs it as one batch and
//! answers each caller. What a batch executes, and how its results map back to its
//! callers, stays with the store: SQLite's writer and reader (`sqlite/dedicated.rs`, with
//! `group_commit.rs` and `group_read.rs`), MySQL's claims and completions
//! (`mysql/group_commit.rs`), Postgres's inserts and completions (`postgres/group.rs`).
//!
//! What every batcher keeps:
//!
//! - **Bounded.** [`MAX_BATCH`] items per batch, [`QUEUE`] waiting; a caller finding the
//!   queue full waits for room (and for the engine's store timeout).
//! - **An answer or an error.** A task that is gone (its runtime shut down), or that
//!   dropped an item unanswered, answers its caller with an error saying what did not
//!   happen, never a success.
//! - **A caller that gave up is seen.** The engine's store timeout drops a caller's wait;
//!   the task sees it ([`Queued::gave_up`]) and leaves the item out where the store's
//!   rules allow.
//! - **Batches grow with the load, with no added wait when there is none.** The task
//!   takes the first item as soon as it arrives and, with [`Waiting::gather`], lets the
//!   requests already in flight add theirs before the batch is taken.

use std::fmt;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::store::StoreError;

/// Items per batch at most: bounds how long one batch holds its lock or statement, and
/// the latency of the batch's first caller.
pub(crate) const MAX_BATCH: usize = 64;

/// Items waiting for the task at most; callers beyond it wait for room.
pub(crate) const QUEUE: usize = 1024;

/// One caller's answer.
pub(crate) type Answer<R> = Result<R, StoreError>;

/// One caller's item, and where its answer goes.
pub(crate) struct Queued<T, R> {
    /// What the caller asked for.
    pub(crate) item: T,
    reply: oneshot::Sender<Answer<R>>,
}

impl<T, R> Queued<T, R> {
    /// Whether the caller stopped waiting (the engine's store timeout): nobody would act
    /// on its answer.
    pub(crate) fn gave_up(&self) -> bool {
        self.reply.is_closed()
    }

    /// Sends the caller its answer; a caller that gave up meanwhile has it dropped.
    pub(crate) fn answer(self, answer: Answer<R>) {
        let _ = self.reply.send(answer);
    }
}

/// The sending side of one batcher task; clones send to the same task, which ends when
/// the last clone is dropped.
pub(crate) struct Batcher<T, R> {
    queue: mpsc::Sender<Queued<T, R>>,
    /// What a caller is told when the task is gone or dropped its item unanswered.
    stopped: &'static str,
}

/// The receiving side: what the task takes its batches from.
pub(crate) struct Waiting<T, R> {
    queue: mpsc::Receiver<Queued<T, R>>,
}

impl<T, R> Batcher<T, R> {
    /// A batcher and the queue its task serves; `stopped` is the error a caller gets when
    /// the task is gone or dropped its item unanswered.
    pub(crate) fn channel(stopped: &'static str) -> (Self, Waiting<T, R>) {
        let (queue, waiting) = mpsc::channel(QUEUE);
        (Self { queue, stopped }, Waiting { queue: waiting })
    }

    /// Queues `item` for the next batch and waits for its answer.
    pub(crate) async fn ask(&self, item: T) -> Answer<R> {
        let stopped = || StoreError::backend(std::io::Error::other(self.stopped));
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Queued { item, reply })
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// Items waiting for the task now.
    pub(crate) fn queued(&self) -> usize {
        self.queue.max_capacity() - self.queue.capacity()
    }
}

impl<T, R> Clone for Batcher<T, R> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
            stopped: self.stopped,
        }
    }
}

impl<T, R> fmt::Debug for Batcher<T, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batcher")
            .field("queued", &self.queued())
            .finish_non_exhaustive()
    }
}

/// How many times [`Waiting::gather`] yields for one batch at most: under a trickle of
/// items, the batch's first callers wait for at most this many rounds of the worker's
/// other tasks.
#[cfg(feature = "sqlite")]
const GATHER_ROUNDS: usize = 8;

impl<T, R> Waiting<T, R> {
    /// Waits for an item, then puts it and whatever else is waiting, up to
    /// [`MAX_BATCH`], into the empty `batch`; `false` once every [`Batcher`] is dropped
    /// and nothing waits.
    pub(crate) async fn recv(&mut self, batch: &mut Vec<Queued<T, R>>) -> bool {
        self.queue.recv_many(batch, MAX_BATCH).await > 0
    }

    /// An item already waiting, if any.
    pub(crate) fn try_next(&mut self) -> Option<Queued<T, R>> {
        self.queue.try_recv().ok()
    }

    /// Lets the tasks that are ready to run queue their items before the batch is taken:
    /// a yield to the scheduler, then whatever arrived, again while items keep arriving
    /// and the batch has room ([`GATHER_ROUNDS`] times at most). With nothing else ready
    /// a yield comes straight back, so an idle store adds no wait; under load the batch
    /// fills from requests already in flight instead of running the first few alone.
    /// (Postgres's and MySQL's batchers take what is waiting without yielding: their
    /// admission of duplicates and bytes is their own.)
    #[cfg(feature = "sqlite")]
    pub(crate) async fn gather(&mut self, batch: &mut Vec<Queued<T, R>>) {
        if batch.len() >= MAX_BATCH {
            return;
        }
        for _ in 0..GATHER_ROUNDS {
            tokio::task::yield_now().await;
            let before = batch.len();
            while batch.len() < MAX_BATCH {
                match self.try_next() {
                    Some(item) => batch.push(item),
                    None => break,
                }
            }
            if batch.len() == before || batch.len() >= MAX_BATCH {
                return;
            }
        }
    }
}

/// The failure of a whole batch, given to each of its callers.
#[derive(Debug, thiserror::Error)]
#[error("{failure}: {source}")]
pub(crate) struct BatchFailed {
    /// What the failure means for the caller, in the batcher's terms.
    failure: &'static str,
    source: Arc<sqlx::Error>,
}

/// Answers every caller of `batch` with a [`BatchFailed`] saying `failure`, caused by
/// `error` — except those whose own answer in `own` (in batch order, possibly shorter
/// than the batch) is already an error, which keep it. Leaves `batch` empty.
pub(crate) fn fail_all<T, R>(
    batch: &mut Vec<Queued<T, R>>,
    failure: &'static str,
    own: Vec<Answer<R>>,
    error: sqlx::Error,
) {
    tracing::warn!(%error, callers = batch.len(), "a batch failed: {failure}");
    let error = Arc::new(error);
    let mut own = own.into_iter();
    for queued in batch.drain(..) {
        let answer = match own.next() {
            Some(Err(own)) => Err(own),
            _ => Err(StoreError::backend(BatchFailed {
                failure,
                source: Arc::clone(&error),
            })),
        };
        queued.answer(answer);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn answers_each_caller_and_sees_one_that_gave_up() {
        let (batcher, mut waiting) = Batcher::<u32, u32>::channel("stopped");
        let asking = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.ask(7).await }
        });
        let gave_up = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.ask(8).await }
        });
        let mut batch = Vec::new();
        while batch.len() < 2 {
            assert!(waiting.recv(&mut batch).await);
        }
        assert_eq!(batcher.queued(), 0);
        gave_up.abort();
        let _ = gave_up.await;
        let (left, right): (Vec<_>, Vec<_>) = batch.into_iter().partition(|q| q.item == 7);
        assert!(!left[0].gave_up());
        assert!(right[0].gave_up());
        for queued in left {
            let n = queued.item;
            queued.answer(Ok(n * 2));
        }
        assert_eq!(asking.await.unwrap().unwrap(), 14);
    }

    #[tokio::test]
    async fn a_task_gone_is_an_error_never_a_success() {
        let (batcher, waiting) = Batcher::<u32, u32>::channel("the task is gone");
        drop(waiting);
        let error = batcher.ask(1).await.unwrap_err();
        assert!(error.to_string().contains("the task is gone"), "{error}");

        let (batcher, mut waiting) = Batcher::<u32, u32>::channel("dropped unanswered");
        let asking = tokio::spawn(async move { batcher.ask(1).await });
        let mut batch = Vec::new();
        assert!(waiting.recv(&mut batch).await);
        drop(batch);
        let error = asking.await.unwrap().unwrap_err();
        assert!(error.to_string().contains("dropped unanswered"), "{error}");
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn batches_are_bounded_and_gather_what_is_in_flight() {
        let (batcher, mut waiting) = Batcher::<usize, ()>::channel("stopped");
        let callers: Vec<_> = (0..MAX_BATCH + 3)
            .map(|n| {
                let batcher = batcher.clone();
                tokio::spawn(async move { batcher.ask(n).await })
            })
            .collect();
        let mut batch = Vec::new();
        assert!(waiting.recv(&mut batch).await);
        waiting.gather(&mut batch).await;
        assert_eq!(batch.len(), MAX_BATCH, "one full batch");
        let mut rest = Vec::new();
        assert!(waiting.recv(&mut rest).await);
        waiting.gather(&mut rest).await;
        assert_eq!(rest.len(), 3, "the rest in the next");
        batch.extend(rest);
        for queued in batch {
            queued.answer(Ok(()));
        }
        for caller in callers {
            tokio::time::timeout(Duration::from_secs(5), caller)
                .await
                .unwrap()
                .unwrap()
                .unwrap();
        }
    }

    #[tokio::test]
    async fn a_failed_batch_fails_every_caller_but_keeps_their_own_errors() {
        let (batcher, mut waiting) = Batcher::<u32, u32>::channel("stopped");
        let callers: Vec<_> = (0..3)
            .map(|n| {
                let batcher = batcher.clone();
                tokio::spawn(async move { batcher.ask(n).await })
            })
            .collect();
        let mut batch = Vec::new();
        while batch.len() < 3 {
            assert!(waiting.recv(&mut batch).await);
        }
        batch.sort_by_key(|q| q.item);
        let own = vec![Ok(0), Err(StoreError::Corrupt("its own".into()))];
        fail_all(
            &mut batch,
            "the batch failed",
            own,
            sqlx::Error::Protocol("why".into()),
        );
        assert!(batch.is_empty());
        let mut answers = Vec::new();
        for caller in callers {
            answers.push(caller.await.unwrap().unwrap_err().to_string());
        }
        assert!(
            answers[0].contains("the batch failed: ") && answers[0].contains("why"),
            "{}",
            answers[0]
        );
        assert!(answers[1].contains("its own"), "{}", answers[1]);
        assert!(answers[2].contains("the batch failed"), "{}", answers[2]);
    }
}
