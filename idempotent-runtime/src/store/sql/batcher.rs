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
//! - **One statement's batch, taken one way** ([`Waiting::next_batch`], Postgres's and
//!   MySQL's): bounded in bytes too, sorted by record so that two batches lock rows in
//!   one order, and, where the statement takes each record once, one item per record.

#[cfg(any(feature = "postgres", feature = "mysql"))]
use std::collections::VecDeque;
use std::fmt;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use std::future::Future;
use std::sync::Arc;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use std::time::Duration;

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
    /// Taken from the queue but left for a later batch by [`Waiting::next_batch`] (a
    /// second item for a record, or past the bytes): they go first next time.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    deferred: VecDeque<Queued<T, R>>,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
/// An item of a batch run as one statement or request ([`Waiting::next_batch`]).
pub(crate) trait Gathered {
    /// The record it is about, in the order a batch locks rows in.
    type Record<'a>: Ord
    where
        Self: 'a;

    /// Whether a batch takes each record once (its statement's arrays hold one row per
    /// record): a second item for a record already in the batch waits for the next one,
    /// so that it sees the first's effect.
    const ONE_PER_RECORD: bool;

    /// The record it is about.
    fn record(&self) -> Self::Record<'_>;

    /// The bytes it adds to a batch, counted against the batch's bound.
    fn bytes(&self) -> usize {
        0
    }
}

impl<T, R> Batcher<T, R> {
    /// A batcher and the queue its task serves; `stopped` is the error a caller gets when
    /// the task is gone or dropped its item unanswered.
    pub(crate) fn channel(stopped: &'static str) -> (Self, Waiting<T, R>) {
        let (queue, waiting) = mpsc::channel(QUEUE);
        let waiting = Waiting {
            queue: waiting,
            #[cfg(any(feature = "postgres", feature = "mysql"))]
            deferred: VecDeque::new(),
        };
        (Self { queue, stopped }, waiting)
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

    /// Waits for an item, then puts it and whatever else is waiting into the empty
    /// `batch`, sorted by record: the items left for later first, at most [`MAX_BATCH`]
    /// of them and `max_bytes` (a first item always goes), one per record where
    /// [`Gathered::ONE_PER_RECORD`]; callers that gave up are left out. `false` once
    /// every [`Batcher`] is dropped and nothing waits.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) async fn next_batch(
        &mut self,
        batch: &mut Vec<Queued<T, R>>,
        max_bytes: usize,
    ) -> bool
    where
        T: Gathered,
    {
        while batch.is_empty() {
            if self.deferred.is_empty() {
                if !self.recv(batch).await {
                    return false;
                }
                self.deferred.extend(batch.drain(..));
            }
            let mut later = VecDeque::new();
            let mut bytes = 0;
            while batch.len() < MAX_BATCH {
                let Some(next) = self.deferred.pop_front().or_else(|| self.try_next()) else {
                    break;
                };
                if next.gave_up() {
                    continue;
                }
                let repeated = T::ONE_PER_RECORD
                    && batch
                        .iter()
                        .any(|taken| taken.item.record() == next.item.record());
                let too_big = !batch.is_empty() && bytes + next.item.bytes() > max_bytes;
                if repeated || too_big {
                    later.push_back(next);
                    continue;
                }
                bytes += next.item.bytes();
                batch.push(next);
            }
            later.append(&mut self.deferred);
            self.deferred = later;
        }
        batch.sort_unstable_by(|a, b| a.item.record().cmp(&b.item.record()));
        true
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

#[cfg(any(feature = "postgres", feature = "mysql"))]
/// How long one batch may take to get its connection and run: a connection whose server
/// stopped answering must not hold up every caller for as long as TCP takes to give up.
pub(crate) const BATCH_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(any(feature = "postgres", feature = "mysql"))]
/// `work` within [`BATCH_TIMEOUT`]; past it, dropped (its connection with it) and an I/O
/// error.
pub(crate) async fn timed<T>(
    work: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    tokio::time::timeout(BATCH_TIMEOUT, work)
        .await
        .unwrap_or_else(|_| {
            Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "a batch statement did not finish within {}s",
                    BATCH_TIMEOUT.as_secs()
                ),
            )))
        })
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
/// `replies`, when there is exactly one for each of a batch's `elements`.
pub(crate) fn one_each<R>(elements: usize, replies: Vec<R>) -> Result<Vec<R>, sqlx::Error> {
    if replies.len() != elements {
        return Err(sqlx::Error::Protocol(format!(
            "a batch of {elements} got {} answers",
            replies.len()
        )));
    }
    Ok(replies)
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

    /// An item for [`Waiting::next_batch`]: a record and a size.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    #[derive(Debug, PartialEq)]
    struct Item(u8, usize);

    #[cfg(any(feature = "postgres", feature = "mysql"))]
    impl Gathered for Item {
        type Record<'a> = u8;
        const ONE_PER_RECORD: bool = true;

        fn record(&self) -> u8 {
            self.0
        }

        fn bytes(&self) -> usize {
            self.1
        }
    }

    #[cfg(any(feature = "postgres", feature = "mysql"))]
    #[tokio::test]
    async fn a_statement_batch_is_sorted_within_its_bytes_with_one_item_per_record() {
        let (batcher, mut waiting) = Batcher::<Item, ()>::channel("stopped");
        let items = [Item(3, 1), Item(1, 1), Item(3, 2), Item(2, 8), Item(0, 1)];
        let mut callers = Vec::new();
        for item in items {
            let asking = batcher.clone();
            callers.push(tokio::spawn(async move { asking.ask(item).await }));
            // Queued in this order.
            while batcher.queued() < callers.len() {
                tokio::task::yield_now().await;
            }
        }
        let gave_up = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.ask(Item(4, 1)).await }
        });
        while batcher.queued() < 6 {
            tokio::task::yield_now().await;
        }
        gave_up.abort();
        let _ = gave_up.await;

        let mut taken = Vec::new();
        let mut batches = Vec::new();
        for _ in 0..3 {
            let mut batch = Vec::new();
            assert!(waiting.next_batch(&mut batch, 4).await);
            batches.push(
                batch
                    .iter()
                    .map(|q| (q.item.0, q.item.1))
                    .collect::<Vec<_>>(),
            );
            taken.extend(batch);
        }
        assert_eq!(
            batches,
            [
                // The second item for record 3 and the one past 4 bytes wait; the caller
                // that gave up is left out.
                vec![(0, 1), (1, 1), (3, 1)],
                vec![(3, 2)],
                // The first item of a batch goes whatever its size.
                vec![(2, 8)],
            ]
        );
        for queued in taken {
            queued.answer(Ok(()));
        }
        for caller in callers {
            caller.await.unwrap().unwrap();
        }
        drop(batcher);
        assert!(!waiting.next_batch(&mut Vec::new(), 4).await, "closed");
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
