//! The operator tools on every SQL dialect: a record read into a [`RecordInfo`], and
//! `forget` as a read that decides plus a fenced `DELETE` that acts only on the record
//! the read saw (run again when it changed in between, like a claim).

use std::future::Future;

use crate::fingerprint::Fingerprint;
use crate::store::operator::{lease_left_from_millis, system_time_from_micros};
use crate::store::{ForgetOutcome, RecordInfo, RecordState, StoreError};

/// How often `forget` runs again when the record changed between its read and its
/// delete (completed, renewed, taken over meanwhile). One retry almost always suffices.
const FORGET_ATTEMPTS: usize = 8;

/// A record as a dialect's inspect statement reads it, judged at one "now" of the
/// database's (or the store's) clock.
#[derive(Debug)]
pub(crate) struct InspectRow {
    /// The `state` column: `in_progress` or `completed`.
    pub(crate) state: String,
    /// The claim's fencing token (what forget's delete is fenced by).
    pub(crate) token: i64,
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) fingerprint_version: i64,
    /// Completed only.
    pub(crate) status: Option<i64>,
    /// Microseconds since the Unix epoch.
    pub(crate) created_at_us: i64,
    pub(crate) expires_at_us: i64,
    /// `None` where a dialect clears it on completion.
    pub(crate) lease_expires_at_us: Option<i64>,
    /// Not expired: `expires_at > now`, or in progress with `lease_expires_at > now`.
    pub(crate) live: bool,
    /// `lease_expires_at > now` (in progress only; `None`/`false` otherwise).
    pub(crate) lease_alive: Option<bool>,
    /// `lease_expires_at - now` in milliseconds, rounded up (in progress only).
    pub(crate) lease_left_ms: Option<i64>,
}

impl InspectRow {
    fn completed(&self) -> Result<bool, StoreError> {
        match self.state.as_str() {
            "completed" => Ok(true),
            "in_progress" => Ok(false),
            other => Err(StoreError::Corrupt(format!(
                "unknown record state {other:?}"
            ))),
        }
    }

    /// The record as an operator sees it (whether or not it is live).
    pub(crate) fn info(&self) -> Result<RecordInfo, StoreError> {
        let state = if self.completed()? {
            let status = self
                .status
                .and_then(|s| u16::try_from(s).ok())
                .ok_or_else(|| {
                    StoreError::Corrupt(format!("completed record with status {:?}", self.status))
                })?;
            RecordState::Completed { status }
        } else {
            let lease_expires_at = self
                .lease_expires_at_us
                .ok_or_else(|| StoreError::Corrupt("in progress without a lease".into()))?;
            RecordState::InProgress {
                lease_expires_at: system_time_from_micros(lease_expires_at),
                holder_alive: self.lease_alive.unwrap_or(false),
            }
        };
        let digest = <[u8; 32]>::try_from(self.fingerprint.as_slice())
            .map_err(|_| StoreError::Corrupt("fingerprint is not 32 bytes".into()))?;
        let version = i16::try_from(self.fingerprint_version).map_err(|_| {
            StoreError::Corrupt(format!(
                "fingerprint version {} out of range",
                self.fingerprint_version
            ))
        })?;
        Ok(RecordInfo::new(
            state,
            Fingerprint { version, digest },
            system_time_from_micros(self.created_at_us),
            system_time_from_micros(self.expires_at_us),
        ))
    }
}

/// `inspect`'s answer from the row its statement read.
pub(crate) fn inspected(row: Option<InspectRow>) -> Result<Option<RecordInfo>, StoreError> {
    match row {
        Some(row) if row.live => row.info().map(Some),
        _ => Ok(None),
    }
}

/// What `forget` does about the record its read found.
#[derive(Debug)]
pub(crate) enum ForgetStep {
    /// Answer without writing: no record, or a live lease and no `force`.
    Answer(ForgetOutcome),
    /// Delete the record the read saw (fenced by its `token` and `state`, and unless
    /// forced by "completed or lease ran out"); if that deletes it, answer `outcome`.
    Delete {
        token: i64,
        state: String,
        outcome: ForgetOutcome,
    },
}

/// The forget rule on the record a read found.
pub(crate) fn forget_step(row: Option<InspectRow>, force: bool) -> Result<ForgetStep, StoreError> {
    let Some(row) = row else {
        return Ok(ForgetStep::Answer(ForgetOutcome::NotFound));
    };
    let outcome = if !row.live {
        // Expired: removed all the same, so the next claim finds nothing at all.
        ForgetOutcome::NotFound
    } else {
        let completed = row.completed()?;
        if !completed && !force && row.lease_alive == Some(true) {
            let left = row.lease_left_ms.unwrap_or(0);
            return Ok(ForgetStep::Answer(ForgetOutcome::Refused {
                lease_left: lease_left_from_millis(left),
            }));
        }
        ForgetOutcome::Forgotten(row.info()?)
    };
    Ok(ForgetStep::Delete {
        token: row.token,
        state: row.state,
        outcome,
    })
}

/// Runs `attempt` until it decides (`Some`), at most [`FORGET_ATTEMPTS`] times.
pub(crate) async fn forget_with_retries<F, Fut>(mut attempt: F) -> Result<ForgetOutcome, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<ForgetOutcome>, StoreError>>,
{
    for n in 1..=FORGET_ATTEMPTS {
        if let Some(outcome) = attempt().await? {
            return Ok(outcome);
        }
        tracing::debug!(
            attempt = n,
            "idempotency record changed during forget; retrying"
        );
    }
    Err(StoreError::backend(
        "the idempotency record kept changing during forget; try again",
    ))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn row(state: &str) -> InspectRow {
        InspectRow {
            state: state.to_owned(),
            token: 7,
            fingerprint: vec![3; 32],
            fingerprint_version: 2,
            status: (state == "completed").then_some(201),
            created_at_us: 1_000_000,
            expires_at_us: 5_000_000,
            lease_expires_at_us: Some(2_000_000),
            live: true,
            lease_alive: Some(state == "in_progress"),
            lease_left_ms: Some(1_500),
        }
    }

    #[test]
    fn reads_rows_as_record_info() {
        let info = inspected(Some(row("in_progress"))).unwrap().unwrap();
        assert_eq!(
            info.state,
            RecordState::InProgress {
                lease_expires_at: UNIX_EPOCH + Duration::from_secs(2),
                holder_alive: true
            }
        );
        assert_eq!(info.fingerprint.version, 2);
        assert_eq!(info.created_at, UNIX_EPOCH + Duration::from_secs(1));
        assert_eq!(info.expires_at, UNIX_EPOCH + Duration::from_secs(5));
        let info = inspected(Some(row("completed"))).unwrap().unwrap();
        assert_eq!(info.state, RecordState::Completed { status: 201 });
        let expired = InspectRow {
            live: false,
            ..row("completed")
        };
        assert_eq!(inspected(Some(expired)).unwrap(), None);
        assert_eq!(inspected(None).unwrap(), None);
        for bad in [
            row("gone"),
            InspectRow {
                fingerprint: vec![1; 31],
                ..row("completed")
            },
            InspectRow {
                status: None,
                ..row("completed")
            },
            InspectRow {
                lease_expires_at_us: None,
                ..row("in_progress")
            },
        ] {
            assert!(matches!(inspected(Some(bad)), Err(StoreError::Corrupt(_))));
        }
    }

    #[test]
    fn forget_refuses_only_a_live_lease_unless_forced() {
        assert!(matches!(
            forget_step(None, true).unwrap(),
            ForgetStep::Answer(ForgetOutcome::NotFound)
        ));
        assert!(matches!(
            forget_step(Some(row("in_progress")), false).unwrap(),
            ForgetStep::Answer(ForgetOutcome::Refused { lease_left }) if lease_left == Duration::from_millis(1_500)
        ));
        assert!(matches!(
            forget_step(Some(row("in_progress")), true).unwrap(),
            ForgetStep::Delete {
                token: 7,
                outcome: ForgetOutcome::Forgotten(_),
                ..
            }
        ));
        let lease_ran_out = InspectRow {
            lease_alive: Some(false),
            ..row("in_progress")
        };
        assert!(matches!(
            forget_step(Some(lease_ran_out), false).unwrap(),
            ForgetStep::Delete {
                outcome: ForgetOutcome::Forgotten(_),
                ..
            }
        ));
        assert!(matches!(
            forget_step(Some(row("completed")), false).unwrap(),
            ForgetStep::Delete {
                outcome: ForgetOutcome::Forgotten(_),
                ..
            }
        ));
        let expired = InspectRow {
            live: false,
            ..row("completed")
        };
        assert!(matches!(
            forget_step(Some(expired), false).unwrap(),
            ForgetStep::Delete {
                outcome: ForgetOutcome::NotFound,
                ..
            }
        ));
    }
}
