//! Conformance checks of the fenced record seam itself, on a backend that hands out the
//! [`RecordStore`] under its store ([`RecordsHarness`]): what the sweeper relies on.

use std::collections::BTreeSet;

use super::{Harness, LEASE, SCOPE, TTL, claim_with, fp, must_claim, response};
use crate::store::{ClaimOutcome, ClaimRequest, FencingToken, RecordStore, Takeover};

/// A backend whose [`Store`](crate::Store) is [`Fenced`](crate::fenced::Fenced) over a
/// [`RecordStore`] it can hand out, so that the checks of the seam run on it too
/// ([`record_trials`](super::record_trials)).
pub trait RecordsHarness: Harness {
    /// The records under [`Harness::store`].
    fn records(&self) -> &dyn RecordStore;
}

/// [`RecordStore::delete_many`], as the sweeper calls it: of six expired records among
/// three live ones, read by [`RecordStore::past_expiry`], it deletes exactly those still
/// at the version read; one renewed by its owner and one taken over between the read
/// and the delete stay, and so do the live ones.
pub async fn check_records_delete_many_deletes_the_versions_read<H: RecordsHarness>() {
    let h = H::new().await;
    let store = h.store();
    let mut owners = Vec::new();
    for i in 0..6 {
        let key = format!("short-{i}");
        let token = must_claim(&*store, SCOPE, &key, fp(1)).await;
        if i < 4 {
            assert!(
                store
                    .complete(SCOPE, &key, token, &response("s"))
                    .await
                    .expect("complete")
            );
        }
        owners.push(token);
    }
    for i in 0..3 {
        let key = format!("long-{i}");
        let token = FencingToken::random();
        let claim = ClaimRequest {
            scope: SCOPE,
            key: &key,
            fingerprint: &fp(1),
            ttl: TTL * 2,
            lease: LEASE,
            token,
        };
        let outcome = store.claim(&claim).await.expect("claim").outcome;
        assert!(
            matches!(outcome, ClaimOutcome::Claimed { .. }),
            "{outcome:?}"
        );
        if i < 2 {
            assert!(
                store
                    .complete(SCOPE, &key, token, &response("l"))
                    .await
                    .expect("complete")
            );
        }
    }
    h.advance(TTL).await;
    let records = h.records();
    let (candidates, _) = records.past_expiry(100).await.expect("past_expiry");
    let read: BTreeSet<&str> = candidates.iter().map(|c| c.key.as_str()).collect();
    let short: BTreeSet<String> = (0..6).map(|i| format!("short-{i}")).collect();
    assert_eq!(
        read,
        short.iter().map(String::as_str).collect(),
        "the expired records, and only those"
    );
    assert!(candidates.iter().all(|c| c.scope == SCOPE));

    // Between the read and the delete: the owner of an in-progress one renews it, and a
    // claim takes a completed one over.
    assert!(
        store
            .renew(SCOPE, "short-5", owners[5], LEASE, TTL)
            .await
            .expect("renew"),
        "its owner still holds it"
    );
    let outcome = claim_with(&*store, SCOPE, "short-0", fp(2), FencingToken::random()).await;
    assert!(
        matches!(
            outcome,
            ClaimOutcome::Claimed {
                takeover: Some(Takeover::Expired),
                ..
            }
        ),
        "{outcome:?}"
    );

    let versions: Vec<(&str, &str, u64)> = candidates
        .iter()
        .map(|c| (c.scope.as_str(), c.key.as_str(), c.record.version))
        .collect();
    assert_eq!(records.delete_many(&[]).await.expect("delete_many"), 0);
    assert_eq!(
        records.delete_many(&versions).await.expect("delete_many"),
        4,
        "the four still at the version read"
    );
    for (key, stays) in [
        ("short-0", true),
        ("short-1", false),
        ("short-2", false),
        ("short-3", false),
        ("short-4", false),
        ("short-5", true),
        ("long-0", true),
        ("long-1", true),
        ("long-2", true),
    ] {
        let (record, _) = records.read(SCOPE, key).await.expect("read");
        assert_eq!(record.is_some(), stays, "{key}");
    }
    assert_eq!(
        records.delete_many(&versions).await.expect("delete_many"),
        0,
        "nothing is at the versions read any more"
    );
    // The renewed claim's owner still holds it, and completes it.
    assert!(
        store
            .complete(SCOPE, "short-5", owners[5], &response("late"))
            .await
            .expect("complete")
    );
}
