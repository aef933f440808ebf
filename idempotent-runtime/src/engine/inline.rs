//! Running a request's claim and handler in the request's own task, as if detached.
//!
//! A client that hangs up drops its request's future. The claim must not be cut off
//! halfway (a claim the store recorded and nothing runs), nor the handler between its
//! side effect and its record. Spawning every request into a task of its own guarantees
//! that, at the cost of a spawn, a wake-up and a hand-over per request. [`Uncancellable`]
//! gives the same guarantee without them: it polls the work in the request's task, and
//! only if it is dropped before the work finished does it spawn the rest, which then runs
//! to its end as the spawned task would have.

use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tracing::{Instrument, Span, error};

type Work<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Work that runs to its end even when the future awaiting it is dropped (see the
/// module docs). While it runs it counts as one of the tracker's tasks, so
/// [`Idempotency::drain`](super::Idempotency::drain) waits for it. It runs in the span
/// that was current when it was made, here or in the task it moves to.
pub(super) struct Uncancellable<T: Send + 'static> {
    work: Option<Work<T>>,
    /// Entered around every poll, rather than wrapping `work` in `Instrumented`: the
    /// work (the handler's whole future) is then moved once, into its box.
    span: Span,
    /// The answer when the work panicked outside the handler.
    interrupted: fn() -> T,
    tracker: TaskTracker,
    _running: TaskTrackerToken,
}

impl<T: Send + 'static> Uncancellable<T> {
    pub(super) fn new(
        work: impl Future<Output = T> + Send + 'static,
        tracker: &TaskTracker,
        interrupted: fn() -> T,
    ) -> Self {
        Self {
            work: Some(Box::pin(work)),
            span: Span::current(),
            interrupted,
            tracker: tracker.clone(),
            _running: tracker.token(),
        }
    }
}

impl<T: Send + 'static> Future for Uncancellable<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = &mut *self;
        let _entered = this.span.enter();
        let Some(work) = this.work.as_mut() else {
            panic!("`Uncancellable` polled after it finished");
        };
        // A panic outside the handler (which has its own guard) answers 500, as a
        // spawned task's panic would, instead of unwinding through the server.
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx)));
        match polled {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(response)) => {
                this.work = None;
                Poll::Ready(response)
            }
            Err(_panic) => {
                this.work = None;
                error!(event = "store_error", "request task panicked");
                Poll::Ready((this.interrupted)())
            }
        }
    }
}

impl<T: Send + 'static> Drop for Uncancellable<T> {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else { return };
        // Dropped unfinished: the rest runs on in a task of its own. Outside a runtime
        // (it is shutting down) there is nowhere to run it, as for any spawned task.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let span = std::mem::replace(&mut self.span, Span::none());
            self.tracker.spawn_on(
                async move {
                    let _ = work.await;
                }
                .instrument(span),
                &runtime,
            );
        } else {
            // Dropped here, in its span, as `Instrumented` would drop it.
            let _entered = self.span.enter();
            drop(work);
        }
    }
}
