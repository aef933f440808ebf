//! The protocol's decisions about one record, as pure functions of the record, the
//! store's [`StoreNow`] and the request: [`Fenced`](super::Fenced) runs the protocol over
//! a [`RecordStore`](super::RecordStore) with these and nothing else, so a store that
//! implements the seam holds records and compares versions but decides nothing. The
//! protocol model calls the same functions (`testing::protocol::rules`).

use std::time::Duration;

use super::{Record, RecordBody, StoreNow};
use crate::fingerprint::Fingerprint;
use crate::store::operator::{lease_left_from_millis, system_time_from_millis};
use crate::store::takeover::{Decision, Found, decide, takeover};
use crate::store::{
    FencingToken, RecordInfo, RecordState, StoreError, decode_steps, release_keeps_record,
};

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
/// [`Takeover::Expired`](crate::store::Takeover::Expired), whatever its request, so the
/// sweeper may delete it and operators no longer see it.
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

/// What `release` does with `record` ([`release_keeps_record`]).
pub fn release(record: &Record) -> Release {
    let holds_steps =
        matches!(&record.body, RecordBody::InProgress { steps, .. } if !steps.is_empty());
    if release_keeps_record(holds_steps) {
        Release::EndLease
    } else {
        Release::Delete
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
