//! The heartbeat: a claim's lease renewed alongside the work that needs it (the handler,
//! then the recording of its outcome), in the same task, and the lease signal raised
//! when the lease is lost.

use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, warn};

use super::execution::Execution;
use super::store_call::store_call;
use crate::metrics::StoreOperation;

/// Runs `work` while renewing `execution`'s lease alongside it, in the same task, so a
/// slow renewal never stalls `work`. `work` is polled first: the heartbeat (and its
/// timer) starts only once `work` has had to wait.
pub(super) async fn with_heartbeat<W: Future>(execution: &Execution, work: W) -> W::Output {
    let heartbeat = heartbeat(execution);
    tokio::pin!(work, heartbeat);
    let mut beating = true;
    loop {
        tokio::select! {
            biased;
            done = &mut work => return done,
            // Ended: the claim is no longer held, nothing is left to renew.
            () = &mut heartbeat, if beating => beating = false,
        }
    }
}

/// Renews the lease every third of it, counted from the claim or the last successful
/// renewal (so a heartbeat built late, or restarted for the completion retries, keeps
/// the schedule); ends when the store says the claim is no longer held. Until the
/// first renewal is due it holds one timer.
///
/// Raises the lease signal (the handler sees [`IdempotencyKey::lease_lost`]) when
/// the store says the claim was taken over, or when the licence ends with no renewal
/// since ([`crate::lease::licence_holds`], counted from before the last successful
/// renewal or the claim was sent), so the signal is raised before the store could
/// hand the key to a retry. That deadline lives in the lease signal, so a heartbeat
/// restarted in the background (completion retries) keeps it.
///
/// [`IdempotencyKey::lease_lost`]: crate::key::IdempotencyKey::lease_lost
async fn heartbeat(execution: &Execution) {
    let period = (execution.lease / 3).max(Duration::from_millis(10));
    let first_tick = execution.lease_signal().granted_at() + period;
    // One timer until the first renewal is due (or the licence ends first).
    tokio::time::sleep_until(first_tick.min(execution.lease_deadline())).await;
    renew_until_released(execution, first_tick, period).await;
}

/// The heartbeat's renewal loop, from the first tick on.
async fn renew_until_released(execution: &Execution, first_tick: Instant, period: Duration) {
    let store = &execution.inner.store;
    let renew_timeout =
        crate::lease::renewal_timeout(execution.inner.store_timeout, execution.lease);
    let (scope, key) = (execution.name.scope(), execution.name.key());
    let (token, lease) = (execution.token, execution.lease);
    let ttl = execution.inner.ttl_for(&execution.config);
    let signal = execution.lease_signal();
    let deadline = || execution.lease_deadline();
    let lose = || {
        if !signal.is_raised() {
            warn!(
                event = "lease_lost",
                "no lease renewal succeeded for (nearly) a whole lease; a retry may take the key over"
            );
            signal.raise();
            signal.count_loss_once(execution.config.name);
        }
    };
    let mut ticker = tokio::time::interval_at(first_tick, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(deadline()), if !signal.is_raised() => {
                lose();
                continue;
            }
            _ = ticker.tick() => {}
        }
        let sent_at = Instant::now();
        let renewal = store.renew(scope, key, token, lease, ttl);
        let renewal = store_call(StoreOperation::Renew, sent_at, renew_timeout, renewal);
        let renewed = tokio::select! {
            renewed = renewal => renewed,
            () = tokio::time::sleep_until(deadline()), if !signal.is_raised() => {
                lose();
                continue;
            }
        };
        match renewed {
            Ok(true) => {
                debug!(event = "renewed", "lease renewed");
                signal.renewed(sent_at);
            }
            // Completed or released just now, or taken over: completion tells
            // which (and warns with `lease_lost` when it was taken over).
            Ok(false) => {
                debug!(event = "renewed", "claim no longer held; heartbeat stops");
                signal.raise();
                return;
            }
            Err(err) => {
                warn!(event = "store_error", error = %err, "renewing the lease failed")
            }
        }
    }
}
