//! The claim of the SQL stores that decide in their own statements (SQLite, MySQL): a
//! found record classified by the engine's takeover rule, and the claim's retry loop.
//! The stores on the fenced record seam (Postgres) decide in `Fenced` instead.

use std::future::Future;
use std::time::Duration;

use super::decode_completed;
use crate::store::takeover::{Decision, Found, decide};
use crate::store::{ClaimOutcome, ClaimRequest, StoreError, Takeover, retry_after_from_millis};

/// How often a claim runs again when the record changed between the statement that
/// tried to claim and the read that says why it did not (released, purged, completed
/// or taken over meanwhile). One retry almost always suffices.
pub(crate) const CLAIM_ATTEMPTS: usize = 8;

/// A record a claim found and did not take, read into dialect-independent terms. Times
/// are judged against one "now" by the statement that read the row.
#[derive(Debug)]
pub(crate) struct FoundRow {
    /// The `state` column: `in_progress` or `completed`.
    pub(crate) state: String,
    /// `expires_at <= now`.
    pub(crate) ttl_ran_out: bool,
    /// `lease_expires_at <= now` (in progress only).
    pub(crate) lease_ran_out: bool,
    /// The record's fingerprint digest and version equal the claim's.
    pub(crate) same_fingerprint: bool,
    /// Milliseconds until the lease runs out (in progress only), for `Retry-After`.
    pub(crate) lease_remaining_ms: Option<i64>,
    /// Milliseconds until the record expires, from no earlier than the claim was sent
    /// (rounded down): a replayed record's remaining life, for the replay cache.
    pub(crate) ttl_remaining_ms: Option<i64>,
    /// The `status`, `headers` and `body` columns (completed only).
    pub(crate) status: Option<i64>,
    pub(crate) headers: Option<Vec<u8>>,
    pub(crate) body: Option<Vec<u8>>,
}

/// What a found record means for the claim that found it.
#[derive(Debug)]
pub(crate) enum Classified {
    /// The record may be taken over, for this reason: the dialect's fenced takeover
    /// statement decides (a refusal there means the record changed: claim again).
    Claimable(Takeover),
    /// The record refuses the claim: replay, in progress or mismatch.
    Refused(Answer),
}

/// A claim's outcome, and a replayed record's remaining life when known (see
/// [`ClaimAnswer::replay_lives_for`](crate::store::ClaimAnswer::replay_lives_for)).
pub(crate) type Answer = (ClaimOutcome, Option<Duration>);

/// Applies the takeover rule to a found record; decodes a completed record's response.
pub(crate) fn classify(row: FoundRow) -> Result<Classified, StoreError> {
    let completed = match row.state.as_str() {
        "completed" => true,
        "in_progress" => false,
        other => {
            return Err(StoreError::Corrupt(format!(
                "unknown record state {other:?}"
            )));
        }
    };
    let found = Found {
        completed,
        ttl_ran_out: row.ttl_ran_out,
        lease_ran_out: row.lease_ran_out,
        same_fingerprint: row.same_fingerprint,
    };
    let answer = match decide(found) {
        Decision::Take(reason) => return Ok(Classified::Claimable(reason)),
        Decision::Mismatch => (ClaimOutcome::Mismatch, None),
        Decision::Replay => {
            let response = decode_completed(row.status, row.headers, row.body)?;
            let life = row
                .ttl_remaining_ms
                .and_then(|ms| u64::try_from(ms).ok())
                .map(Duration::from_millis);
            (ClaimOutcome::Replay(response), life)
        }
        Decision::InProgress => {
            let remaining = row
                .lease_remaining_ms
                .ok_or_else(|| StoreError::Corrupt("in progress without a lease".into()))?;
            let retry_after = retry_after_from_millis(remaining);
            (ClaimOutcome::InProgress { retry_after }, None)
        }
    };
    Ok(Classified::Refused(answer))
}

/// Runs `attempt` until it decides (`Some`), at most [`CLAIM_ATTEMPTS`] times; a record
/// that kept changing under every attempt is [`contended`].
pub(crate) async fn claim_with_retries<F, Fut>(
    claim: &ClaimRequest<'_>,
    mut attempt: F,
) -> Result<Answer, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<Answer>, StoreError>>,
{
    for n in 1..=CLAIM_ATTEMPTS {
        if let Some(outcome) = attempt().await? {
            return Ok(outcome);
        }
        tracing::debug!(
            attempt = n,
            "idempotency record changed during claim; retrying"
        );
    }
    Ok((contended(claim, CLAIM_ATTEMPTS), None))
}

/// A store's answer when the record kept changing under every claim attempt: someone
/// else is busy with the key, which is what `409 request_in_progress` says. Nothing ran.
pub(crate) fn contended(claim: &ClaimRequest<'_>, attempts: usize) -> ClaimOutcome {
    tracing::warn!(
        scope = claim.scope,
        key = claim.key,
        attempts,
        "idempotency record kept changing during claim; answering in progress"
    );
    ClaimOutcome::InProgress {
        retry_after: Duration::from_secs(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::encode_headers;

    fn row(state: &str) -> FoundRow {
        FoundRow {
            state: state.to_owned(),
            ttl_ran_out: false,
            lease_ran_out: false,
            same_fingerprint: true,
            lease_remaining_ms: Some(1500),
            ttl_remaining_ms: Some(60_000),
            status: None,
            headers: None,
            body: None,
        }
    }

    #[test]
    fn classifies_found_records() {
        assert!(matches!(
            classify(row("in_progress")).unwrap(),
            Classified::Refused((ClaimOutcome::InProgress { retry_after }, None)) if retry_after == Duration::from_secs(2)
        ));
        let lease_ran_out = FoundRow {
            lease_ran_out: true,
            ..row("in_progress")
        };
        assert!(matches!(
            classify(lease_ran_out).unwrap(),
            Classified::Claimable(Takeover::LeaseLost)
        ));
        let other = FoundRow {
            same_fingerprint: false,
            ..row("in_progress")
        };
        assert!(matches!(
            classify(other).unwrap(),
            Classified::Refused((ClaimOutcome::Mismatch, None))
        ));
        let completed = FoundRow {
            status: Some(201),
            headers: Some(encode_headers(&[("a".into(), b"b".to_vec())])),
            body: Some(b"x".to_vec()),
            ..row("completed")
        };
        match classify(completed).unwrap() {
            Classified::Refused((ClaimOutcome::Replay(r), life)) => {
                assert_eq!(life, Some(Duration::from_secs(60)));
                assert_eq!(r.status, 201);
                assert_eq!(r.headers, vec![("a".to_owned(), b"b".to_vec())]);
                assert_eq!(r.body.as_deref(), Some(&b"x"[..]));
            }
            other => panic!("{other:?}"),
        }
        let expired = FoundRow {
            ttl_ran_out: true,
            lease_ran_out: true,
            ..row("completed")
        };
        assert!(matches!(
            classify(expired).unwrap(),
            Classified::Claimable(Takeover::Expired)
        ));
    }

    #[test]
    fn refuses_corrupt_records() {
        assert!(matches!(classify(row("gone")), Err(StoreError::Corrupt(_))));
        let no_status = FoundRow {
            headers: Some(encode_headers(&[])),
            ..row("completed")
        };
        assert!(matches!(classify(no_status), Err(StoreError::Corrupt(_))));
        let bad_status = FoundRow {
            status: Some(70_000),
            headers: Some(encode_headers(&[])),
            ..row("completed")
        };
        assert!(matches!(classify(bad_status), Err(StoreError::Corrupt(_))));
        let no_headers = FoundRow {
            status: Some(200),
            ..row("completed")
        };
        assert!(matches!(classify(no_headers), Err(StoreError::Corrupt(_))));
        let no_lease = FoundRow {
            lease_remaining_ms: None,
            ..row("in_progress")
        };
        assert!(matches!(classify(no_lease), Err(StoreError::Corrupt(_))));
    }
}
