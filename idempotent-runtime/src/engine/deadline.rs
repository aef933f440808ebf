//! Bounding work by a deadline without arming a timer for work that needs none.

use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

pin_project! {
    /// `work`'s output, or `None` once `deadline` passed. Work that is done at its first
    /// poll (a handler that answers at once, an in-process store's call) arms no timer:
    /// a timer costs a clock read and a registration with the runtime's timer, per
    /// request.
    ///
    /// A struct rather than an `async fn`: an `async fn` keeps its by-value argument in
    /// its state beside the pinned copy it polls, so a handler's whole future would be
    /// held (and moved) twice per layer.
    pub(super) struct ByDeadline<F> {
        #[pin]
        work: F,
        deadline: Instant,
        #[pin]
        timer: Option<Sleep>,
    }
}

impl<F: Future> ByDeadline<F> {
    pub(super) fn new(deadline: Instant, work: F) -> Self {
        Self {
            work,
            deadline,
            timer: None,
        }
    }
}

impl<F: Future> Future for ByDeadline<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        // The work first, as `tokio::time::timeout` does: output that is ready at the
        // deadline is kept.
        if let Poll::Ready(output) = this.work.poll(cx) {
            return Poll::Ready(Some(output));
        }
        if this.timer.is_none() {
            this.timer
                .set(Some(tokio::time::sleep_until(*this.deadline)));
        }
        match this.timer.as_pin_mut().map(|timer| timer.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(None),
            _ => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ready_work_is_kept_and_arms_no_timer() {
        let bounded = ByDeadline::new(Instant::now(), std::future::ready(7));
        let mut bounded = std::pin::pin!(bounded);
        assert_eq!(bounded.as_mut().await, Some(7));
        assert!(bounded.timer.is_none(), "work ready at once needs no timer");
    }

    #[tokio::test(start_paused = true)]
    async fn pending_work_ends_at_the_deadline() {
        let deadline = Instant::now() + Duration::from_millis(50);
        let slept = ByDeadline::new(deadline, tokio::time::sleep(Duration::from_secs(1)));
        assert_eq!(slept.await, None);
        assert_eq!(Instant::now(), deadline);
    }

    #[tokio::test(start_paused = true)]
    async fn work_that_finishes_before_the_deadline_wins() {
        let deadline = Instant::now() + Duration::from_secs(1);
        let work = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            "done"
        };
        assert_eq!(ByDeadline::new(deadline, work).await, Some("done"));
    }
}
