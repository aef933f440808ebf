//! The protocol's decisions about one record, as pure functions of the record, the
//! store's [`StoreNow`] and the request: [`Fenced`](super::Fenced) runs the protocol over
//! a [`RecordStore`](crate::store::RecordStore) with these and nothing else, so a store
//! that implements the seam holds records and compares versions but decides nothing. The
//! protocol model calls the same functions (`testing::protocol::rules`).
//!
//! The takeover rule ([`takeover`]) comes first in every claim's decision ([`decide`]);
//! which steps a takeover keeps is [`steps_survive`]; what a release does is [`release`].

use std::time::Duration;

use crate::fingerprint::Fingerprint;
use crate::store::{
    FencingToken, Record, RecordBody, RecordInfo, RecordState, StoreError, StoreNow, Takeover,
    decode_steps, lease_left_from_millis, system_time_from_millis,
};

/// What a claim needs to know about the record it found, as of one instant "now".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Found {
    /// `true`: completed; `false`: in progress.
    pub completed: bool,
    /// The record's TTL ran out (`expires_at <= now`).
    pub ttl_ran_out: bool,
    /// An in-progress record's lease ran out (`lease_expires_at <= now`); ignored for a
    /// completed record.
    pub lease_ran_out: bool,
    /// The claim's fingerprint (digest and version) equals the record's.
    pub same_fingerprint: bool,
}

/// What a claim does with the record it found: the whole decision, of which the
/// takeover rule is the first step. Every store's classification goes through
/// [`decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// The claim takes the record over, for this reason.
    Take(Takeover),
    /// Another request used the key: `422`.
    Mismatch,
    /// Completed with the claim's fingerprint: replay it.
    Replay,
    /// Running under a live lease with the claim's fingerprint: `409` (or wait).
    InProgress,
}

/// The claim's decision for a record it found: the takeover rule first, then a
/// different fingerprint is a mismatch, then a completed record replays and an
/// in-progress one is still running.
pub fn decide(found: Found) -> Decision {
    match takeover(found) {
        Some(reason) => Decision::Take(reason),
        None if !found.same_fingerprint => Decision::Mismatch,
        None if found.completed => Decision::Replay,
        None => Decision::InProgress,
    }
}

/// The takeover rule. A record may be taken over when
///
/// - its TTL ran out and nothing is running under it (completed, or its lease ran out
///   too): [`Takeover::Expired`], by any request; or
/// - it is in progress, its lease ran out, and the claim has the same fingerprint (a
///   retry of the crashed request, never another request reusing the key):
///   [`Takeover::LeaseLost`].
///
/// A live lease always wins over the TTL: a handler outliving its TTL keeps its claim as
/// long as it heartbeats.
pub fn takeover(found: Found) -> Option<Takeover> {
    let running = !found.completed && !found.lease_ran_out;
    if found.ttl_ran_out && !running {
        Some(Takeover::Expired)
    } else if !found.completed && found.lease_ran_out && found.same_fingerprint {
        Some(Takeover::LeaseLost)
    } else {
        None
    }
}

/// Whether a claim that took a record over for `reason` keeps the record's steps: only
/// the retry of a request whose lease was lost resumes it; an expired record's steps end
/// with its lifetime.
pub fn steps_survive(reason: Takeover) -> bool {
    match reason {
        Takeover::LeaseLost => true,
        Takeover::Expired => false,
    }
}

/// What the record looks like to a claim with `fingerprint` at `now`: the input of the
/// takeover rule ([`decide`]).
pub fn found(record: &Record, now: StoreNow, fingerprint: &Fingerprint) -> Found {
    Found {
        completed: matches!(record.body, RecordBody::Completed(_)),
        ttl_ran_out: record.expires_at <= now.wall_millis,
        lease_ran_out: lease_left(record, now).is_some_and(|left| left <= 0),
        same_fingerprint: record.fingerprint == *fingerprint,
    }
}

/// What a claim with `fingerprint` does with the record it found at `now`.
pub fn claim(record: &Record, now: StoreNow, fingerprint: &Fingerprint) -> Decision {
    decide(found(record, now, fingerprint))
}

/// An in-progress record's lease left at `now`, in milliseconds (zero or less: ran
/// out); `None` for a completed record.
pub fn lease_left(record: &Record, now: StoreNow) -> Option<i64> {
    match record.body {
        RecordBody::InProgress {
            lease_expires_at, ..
        } => Some(lease_expires_at.saturating_sub(now.lease_millis)),
        RecordBody::Completed(_) => None,
    }
}

/// Whether `token` owns the record: it is in progress under that token's claim.
pub fn owned_by(record: &Record, token: FencingToken) -> bool {
    record.token == token && matches!(record.body, RecordBody::InProgress { .. })
}

/// Whether the record is expired at `now`: a claim would take it over as
/// [`Takeover::Expired`], whatever its request, so the sweeper may delete it and
/// operators no longer see it.
pub fn expired(record: &Record, now: StoreNow) -> bool {
    let found = Found {
        same_fingerprint: false,
        ..found(record, now, &record.fingerprint)
    };
    takeover(found).is_some()
}

/// What `release` does with the record its owner gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Delete it: the next request claims the key anew.
    Delete,
    /// Keep it, its lease ended now and its token [`FencingToken::RELEASED`], so that the
    /// retry of the same request resumes after its steps.
    EndLease,
}

/// What `release` does with `record`: it keeps exactly the records with steps, so a
/// released request resumes, and a key that recorded nothing is free again as before.
pub fn release(record: &Record) -> Release {
    match &record.body {
        RecordBody::InProgress { steps, .. } if !steps.is_empty() => Release::EndLease,
        _ => Release::Delete,
    }
}

/// What `forget` does with the record it found at `now`.
#[derive(Debug)]
pub enum Forget {
    /// Delete it and report it as it was.
    Delete(RecordInfo),
    /// Delete it (it is expired) and report nothing.
    DeleteExpired,
    /// Leave it: a holder's lease is live and the forget is not forced.
    Refuse(Duration),
}

/// What `forget` (forced or not) does with `record` at `now`.
pub fn forget(record: &Record, now: StoreNow, force: bool) -> Result<Forget, StoreError> {
    if expired(record, now) {
        return Ok(Forget::DeleteExpired);
    }
    match lease_left(record, now) {
        Some(left) if left > 0 && !force => Ok(Forget::Refuse(lease_left_from_millis(left))),
        _ => Ok(Forget::Delete(info(record, now)?)),
    }
}

/// What an operator sees of a live `record` at `now` (`None`: it is expired).
pub fn inspect(record: &Record, now: StoreNow) -> Result<Option<RecordInfo>, StoreError> {
    if expired(record, now) {
        return Ok(None);
    }
    info(record, now).map(Some)
}

/// A record's description at `now`; a lease's end in wall-clock time.
fn info(record: &Record, now: StoreNow) -> Result<RecordInfo, StoreError> {
    let (state, steps) = match &record.body {
        RecordBody::InProgress { steps, .. } => {
            let left = lease_left(record, now).unwrap_or(0);
            let state = RecordState::InProgress {
                lease_expires_at: system_time_from_millis(now.wall_millis.saturating_add(left)),
                holder_alive: left > 0,
            };
            (state, decode_steps(steps)?)
        }
        RecordBody::Completed(response) => (
            RecordState::Completed {
                status: response.status,
            },
            Vec::new(),
        ),
    };
    Ok(RecordInfo::new(
        state,
        record.fingerprint,
        system_time_from_millis(record.created_at),
        system_time_from_millis(record.expires_at),
    )
    .with_steps(steps))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(completed: bool, ttl: bool, lease: bool, same: bool) -> Found {
        Found {
            completed,
            ttl_ran_out: ttl,
            lease_ran_out: lease,
            same_fingerprint: same,
        }
    }

    #[test]
    fn the_rule() {
        // Completed: only expiry frees it.
        assert_eq!(takeover(found(true, false, true, true)), None);
        assert_eq!(
            takeover(found(true, true, false, false)),
            Some(Takeover::Expired)
        );
        // In progress, lease live: never, even past the TTL.
        assert_eq!(takeover(found(false, true, false, true)), None);
        assert_eq!(takeover(found(false, false, false, true)), None);
        // In progress, lease ran out: expiry first, then same fingerprint only.
        assert_eq!(
            takeover(found(false, true, true, false)),
            Some(Takeover::Expired)
        );
        assert_eq!(
            takeover(found(false, true, true, true)),
            Some(Takeover::Expired)
        );
        assert_eq!(
            takeover(found(false, false, true, true)),
            Some(Takeover::LeaseLost)
        );
        assert_eq!(takeover(found(false, false, true, false)), None);
    }

    #[test]
    fn only_a_lost_lease_keeps_the_steps() {
        assert!(steps_survive(Takeover::LeaseLost));
        assert!(!steps_survive(Takeover::Expired));
    }
}
