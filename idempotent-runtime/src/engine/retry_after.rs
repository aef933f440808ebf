//! `Retry-After` for a request whose key is still being processed: how long the handler
//! usually takes, not the whole lease.
//!
//! The store reports how much of the holder's lease is left, but heartbeats renew it
//! every third of a lease, so that is nearly always the full lease (30 s by default) —
//! far too long for a client to wait on a 50 ms handler. The engine therefore keeps, per
//! named handler (the attribute names each one after its function), a running average
//! of how long its claimed runs took from claim to recorded outcome, and answers that,
//! rounded up to whole seconds (at least one), never more than the lease left. A handler
//! with no completed run yet (or an unnamed one) gets the lease left.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Running estimates of how long each named handler takes.
#[derive(Debug, Default)]
pub(super) struct DurationEstimates {
    /// Exponentially weighted mean duration in microseconds, per handler name; 0 = none.
    by_handler: RwLock<HashMap<&'static str, Arc<AtomicU64>>>,
}

/// Weight of a new sample: 1/8, so one slow outlier moves the estimate by an eighth.
const SAMPLE_WEIGHT_SHIFT: u32 = 3;

impl DurationEstimates {
    /// Records that a run of `handler` took `took`.
    pub(super) fn observe(&self, handler: Option<&'static str>, took: Duration) {
        let Some(handler) = handler else { return };
        let sample = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        let slot = self.slot(handler);
        // A lost race between two updates loses one sample's weight: harmless.
        let old = slot.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            let (old, sample) = (i128::from(old), i128::from(sample));
            let moved = old + ((sample - old) >> SAMPLE_WEIGHT_SHIFT);
            u64::try_from(moved.max(1)).unwrap_or(u64::MAX)
        };
        slot.store(new, Ordering::Relaxed);
    }

    /// The `Retry-After` for a duplicate of a running `handler` whose holder has
    /// `lease_left`.
    pub(super) fn retry_after(
        &self,
        handler: Option<&'static str>,
        lease_left: Duration,
    ) -> Duration {
        let lease_secs = lease_left.as_secs().max(1);
        let Some(mean_micros) = handler.and_then(|name| self.mean_micros(name)) else {
            return Duration::from_secs(lease_secs);
        };
        let secs = mean_micros.div_ceil(1_000_000).max(1);
        Duration::from_secs(secs.min(lease_secs))
    }

    fn mean_micros(&self, handler: &'static str) -> Option<u64> {
        let map = self.by_handler.read().unwrap_or_else(|e| e.into_inner());
        let mean = map.get(handler)?.load(Ordering::Relaxed);
        (mean > 0).then_some(mean)
    }

    fn slot(&self, handler: &'static str) -> Arc<AtomicU64> {
        if let Some(slot) = self
            .by_handler
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(handler)
        {
            return slot.clone();
        }
        let mut map = self.by_handler.write().unwrap_or_else(|e| e.into_inner());
        map.entry(handler).or_default().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);

    #[test]
    fn without_runs_the_lease_left() {
        let estimates = DurationEstimates::default();
        assert_eq!(estimates.retry_after(Some("h"), LEASE), LEASE);
        assert_eq!(estimates.retry_after(None, LEASE), LEASE);
    }

    #[test]
    fn a_fast_handler_gets_one_second() {
        let estimates = DurationEstimates::default();
        estimates.observe(Some("fast"), Duration::from_millis(50));
        assert_eq!(
            estimates.retry_after(Some("fast"), LEASE),
            Duration::from_secs(1)
        );
        // Other handlers keep their own estimate.
        assert_eq!(estimates.retry_after(Some("other"), LEASE), LEASE);
        // Unnamed runs are not recorded.
        estimates.observe(None, Duration::from_millis(50));
        assert_eq!(estimates.retry_after(None, LEASE), LEASE);
    }

    #[test]
    fn rounds_up_and_never_exceeds_the_lease_left() {
        let estimates = DurationEstimates::default();
        estimates.observe(Some("slow"), Duration::from_millis(4_200));
        assert_eq!(
            estimates.retry_after(Some("slow"), LEASE),
            Duration::from_secs(5)
        );
        assert_eq!(
            estimates.retry_after(Some("slow"), Duration::from_secs(2)),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn follows_a_changing_handler_gradually() {
        let estimates = DurationEstimates::default();
        estimates.observe(Some("h"), Duration::from_secs(1));
        estimates.observe(Some("h"), Duration::from_secs(9));
        // One eighth of the way from 1 s to 9 s.
        assert_eq!(estimates.mean_micros("h"), Some(2_000_000));
        for _ in 0..100 {
            estimates.observe(Some("h"), Duration::from_secs(9));
        }
        assert_eq!(
            estimates.retry_after(Some("h"), LEASE),
            Duration::from_secs(9)
        );
    }
}
