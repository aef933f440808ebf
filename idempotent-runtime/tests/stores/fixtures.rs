//! What the stores' own tests share: one fingerprint, TTL and lease, a claim request, a
//! stored response, and the assertion that a claim resumes recorded steps.

use std::time::Duration;

use bytes::Bytes;
use idempotent_runtime::store::RecordedStep;
use idempotent_runtime::store::{
    ClaimOutcome, ClaimRequest, FencingToken, StoredResponse, Takeover,
};
use idempotent_runtime::{Fingerprint, Store};

pub(crate) const FINGERPRINT: Fingerprint = Fingerprint {
    version: 1,
    digest: [42; 32],
};
pub(crate) const TTL: Duration = Duration::from_secs(3600);
pub(crate) const LEASE: Duration = Duration::from_secs(30);

/// A claim of `key` in scope `acct_alice` with [`FINGERPRINT`], [`TTL`] and [`LEASE`].
pub(crate) fn claim_request(key: &str, token: FencingToken) -> ClaimRequest<'_> {
    ClaimRequest {
        scope: "acct_alice",
        key,
        fingerprint: &FINGERPRINT,
        ttl: TTL,
        lease: LEASE,
        token,
    }
}

/// A `201` JSON response with `body`.
#[allow(dead_code)] // not every store's tests record a response of their own
pub(crate) fn stored(body: &'static [u8]) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![("content-type".to_owned(), b"application/json".to_vec())],
        body: Some(Bytes::from_static(body)),
    }
}

/// Claims `key` (as [`claim_request`]) with a fresh token and asserts that it takes over a
/// lost lease and resumes with `steps`; returns the token.
pub(crate) async fn must_resume(
    store: &dyn Store,
    key: &str,
    steps: Vec<RecordedStep>,
) -> FencingToken {
    let token = FencingToken::random();
    let outcome = store
        .claim(&claim_request(key, token))
        .await
        .expect("claim")
        .outcome;
    assert_eq!(
        outcome,
        ClaimOutcome::Claimed {
            token,
            takeover: Some(Takeover::LeaseLost),
            steps,
        }
    );
    token
}
