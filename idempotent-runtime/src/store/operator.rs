//! What an operator sees and does with one record: [`RecordInfo`] (what
//! [`Store::inspect`](super::Store::inspect) reports) and [`ForgetOutcome`] (what
//! [`Store::forget`](super::Store::forget) did).
//!
//! Both are judged at one instant of the store's own clock (the database's for Postgres
//! and MySQL, the server's `TIME` for Redis, the injected [`Clock`](crate::clock::Clock) for
//! memory and SQLite), like every other store decision.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::RecordedStep;
use crate::fingerprint::Fingerprint;

/// A live record as [`Store::inspect`](super::Store::inspect) found it.
///
/// A record whose TTL ran out and under which nothing runs (what a claim would take over
/// as [`Takeover::Expired`](super::Takeover::Expired)) is not live: `inspect` reports it
/// as absent, whether or not it was purged yet.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordInfo {
    /// In progress (with its lease) or completed (with the recorded status).
    pub state: RecordState,
    /// The fingerprint of the request that claimed the key: its algorithm version and
    /// SHA-256 digest (a hash of the request, not the request).
    pub fingerprint: Fingerprint,
    /// When the claim that wrote the record was made (a takeover makes a new one).
    pub created_at: SystemTime,
    /// When the record stops being live, unless a running claim's lease holds it longer.
    pub expires_at: SystemTime,
    /// The steps completed under an in-progress record (a released one included), in
    /// the order they were recorded; empty for a completed record, whose response
    /// replaces them.
    pub steps: Vec<RecordedStep>,
}

impl RecordInfo {
    /// A record's description; for stores outside this crate (the struct is
    /// `#[non_exhaustive]`, so it cannot be built field by field there).
    pub fn new(
        state: RecordState,
        fingerprint: Fingerprint,
        created_at: SystemTime,
        expires_at: SystemTime,
    ) -> Self {
        Self {
            state,
            fingerprint,
            created_at,
            expires_at,
            steps: Vec::new(),
        }
    }

    /// The same description with the record's recorded `steps`.
    pub fn with_steps(mut self, steps: Vec<RecordedStep>) -> Self {
        self.steps = steps;
        self
    }

    /// The at-most-once steps of this record whose call was made and whose outcome was not
    /// recorded: a record stuck on an unknown outcome
    /// ([`StepError::OutcomeUnknown`](crate::StepError::OutcomeUnknown)) names them here.
    /// Resolve one with [`Idempotency::resolve_step`](crate::Idempotency::resolve_step),
    /// or forget the key.
    pub fn unknown_outcomes(&self) -> Vec<&str> {
        super::unsettled_intents(&self.steps)
    }

    /// Whether a request is still running under this record: in progress with a lease
    /// that has not run out.
    pub fn holder_alive(&self) -> bool {
        matches!(
            self.state,
            RecordState::InProgress {
                holder_alive: true,
                ..
            }
        )
    }
}

/// Where a record is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordState {
    /// Claimed; no response recorded yet.
    InProgress {
        /// When the claim's lease runs out unless its holder renews it.
        lease_expires_at: SystemTime,
        /// The lease has not run out (`now < lease_expires_at`): the holder is presumed
        /// running. `false`: it stopped heartbeating (crashed or stalled); a retry with
        /// the same fingerprint would take the claim over.
        holder_alive: bool,
    },
    /// The response is recorded and replayed to retries.
    Completed {
        /// The recorded HTTP status.
        status: u16,
    },
}

/// What [`Store::forget`](super::Store::forget) did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForgetOutcome {
    /// The record was deleted; this is what it was. The next request with the key runs as
    /// new. A forgotten in-progress claim's holder is fenced off: its `renew`, `complete`
    /// and `release` return `false`.
    Forgotten(RecordInfo),
    /// Nothing was deleted: a request is running under the record (its lease has not run
    /// out). Forget with `force` to delete it anyway.
    Refused {
        /// Until the holder's lease runs out, unless it renews it.
        lease_left: Duration,
    },
    /// There was no live record of the key (never claimed, released, purged, or
    /// expired — an expired record that was still stored is removed too).
    NotFound,
}

/// The time `micros` microseconds after (before, if negative) the Unix epoch.
pub(crate) fn system_time_from_micros(micros: i64) -> SystemTime {
    let offset = Duration::from_micros(micros.unsigned_abs());
    if micros >= 0 {
        UNIX_EPOCH + offset
    } else {
        UNIX_EPOCH - offset
    }
}

/// The time `millis` milliseconds after (before, if negative) the Unix epoch.
pub(crate) fn system_time_from_millis(millis: i64) -> SystemTime {
    system_time_from_micros(millis.saturating_mul(1000))
}

/// A lease's time left, from milliseconds that may be zero or negative (ran out).
pub(crate) fn lease_left_from_millis(millis: i64) -> Duration {
    Duration::from_millis(u64::try_from(millis).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_epoch_offsets() {
        assert_eq!(system_time_from_micros(0), UNIX_EPOCH);
        assert_eq!(
            system_time_from_millis(1_500),
            UNIX_EPOCH + Duration::from_millis(1_500)
        );
        assert_eq!(
            system_time_from_micros(-2),
            UNIX_EPOCH - Duration::from_micros(2)
        );
        assert_eq!(lease_left_from_millis(-5), Duration::ZERO);
        assert_eq!(lease_left_from_millis(1_001), Duration::from_millis(1_001));
    }
}
