//! Conformance checks of the operator tools, [`Store::inspect`] and [`Store::forget`].

use std::sync::Arc;
use std::time::Duration;

use super::{
    Backend, KEY, LEASE, SCOPE, TTL, claim, claim_in, complete, fp, must_claim, release, renew,
    response, setup,
};
use crate::fingerprint::Fingerprint;
use crate::store::{ClaimOutcome, ForgetOutcome, RecordInfo, RecordState, Store};

async fn inspect(store: &dyn Store, scope: &str) -> Option<RecordInfo> {
    store.inspect(scope, KEY).await.expect("inspect")
}

async fn forget(store: &dyn Store, scope: &str, force: bool) -> ForgetOutcome {
    store.forget(scope, KEY, force).await.expect("forget")
}

/// The in-progress state of `info`, as `(lease_expires_at, holder_alive)`.
fn in_progress(info: &RecordInfo) -> (std::time::SystemTime, bool) {
    match info.state {
        RecordState::InProgress {
            lease_expires_at,
            holder_alive,
        } => (lease_expires_at, holder_alive),
        other => panic!("expected in progress, got {other:?}"),
    }
}

/// `Refused`'s lease time left, asserted to lie in `(0, at_most]`.
fn assert_refused(outcome: &ForgetOutcome, at_most: Duration) {
    match outcome {
        ForgetOutcome::Refused { lease_left } => assert!(
            !lease_left.is_zero() && *lease_left <= at_most,
            "lease_left {lease_left:?} not in (0, {at_most:?}]"
        ),
        other => panic!("expected Refused, got {other:?}"),
    }
}

/// Inspect reports nothing for a key never claimed; an in-progress record with its
/// fingerprint (version included), creation, expiry and lease, its holder alive until
/// the lease runs out; a completed record with its status; and nothing once expired.
pub async fn check_inspect_reports_each_state(backend: Backend) {
    let (h, store) = setup(backend).await;
    assert_eq!(inspect(&*store, SCOPE).await, None, "never claimed");
    let v2 = Fingerprint {
        version: 2,
        ..fp(5)
    };
    let token = must_claim(&*store, SCOPE, KEY, v2).await;
    let info = inspect(&*store, SCOPE).await.expect("in progress");
    assert_eq!(info.fingerprint, v2);
    let (lease_expires_at, alive) = in_progress(&info);
    assert!(alive, "a fresh claim's holder is alive");
    assert!(info.holder_alive());
    assert_eq!(
        info.expires_at.duration_since(info.created_at).ok(),
        Some(TTL)
    );
    assert_eq!(
        lease_expires_at.duration_since(info.created_at).ok(),
        Some(LEASE)
    );

    h.advance(LEASE).await;
    let stale = inspect(&*store, SCOPE)
        .await
        .expect("within its TTL, the record is still there");
    let (_, alive) = in_progress(&stale);
    assert!(!alive, "the lease ran out: the holder is presumed dead");
    assert!(!stale.holder_alive());
    assert_eq!(stale.fingerprint, v2);
    assert_eq!(
        stale.expires_at.duration_since(stale.created_at).ok(),
        Some(TTL)
    );

    assert!(renew(&*store, token, LEASE).await, "still the owner");
    let renewed = inspect(&*store, SCOPE).await.expect("renewed");
    assert!(renewed.holder_alive(), "renewed: alive again");
    let kept = |info: &RecordInfo| {
        let life = info
            .expires_at
            .duration_since(info.created_at)
            .unwrap_or_default();
        // A database store's clock also runs while the check does.
        life >= LEASE + TTL && life < LEASE + TTL + Duration::from_secs(5)
    };
    assert!(
        kept(&renewed),
        "a renewal keeps the record a TTL past it: {renewed:?}"
    );
    assert!(complete(&*store, token, &response("a")).await);
    let done = inspect(&*store, SCOPE).await.expect("completed");
    assert_eq!(done.state, RecordState::Completed { status: 201 });
    assert!(!done.holder_alive());
    assert_eq!(done.fingerprint, v2);
    assert!(kept(&done), "completion keeps the expiry: {done:?}");

    h.advance(TTL - Duration::from_secs(1)).await;
    assert!(inspect(&*store, SCOPE).await.is_some(), "not yet expired");
    h.advance(Duration::from_secs(1)).await;
    assert_eq!(inspect(&*store, SCOPE).await, None, "expired");
}

/// Forgetting a completed record deletes it: it is reported as it was, inspect finds
/// nothing, and the next request with the key (any fingerprint) is a new claim.
pub async fn check_forget_completed_lets_the_key_run_as_new(backend: Backend) {
    let (_h, store) = setup(backend).await;
    let token = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    assert!(complete(&*store, token, &response("a")).await);
    let before = inspect(&*store, SCOPE).await.expect("completed");
    assert_eq!(
        forget(&*store, SCOPE, false).await,
        ForgetOutcome::Forgotten(before)
    );
    assert_eq!(inspect(&*store, SCOPE).await, None);
    assert_eq!(forget(&*store, SCOPE, false).await, ForgetOutcome::NotFound);
    let new = must_claim(&*store, SCOPE, KEY, fp(2)).await;
    assert!(!complete(&*store, token, &response("stale")).await);
    assert!(complete(&*store, new, &response("b")).await);
    let (outcome, _) = claim(&*store, fp(2)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("b")));
}

/// A request running under a live lease is not forgotten unless forced: `Refused` with
/// the lease time left (shrinking as time passes), nothing changed, and the owner still
/// completes.
pub async fn check_forget_refuses_a_live_claim(backend: Backend) {
    let (h, store) = setup(backend).await;
    let token = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    assert_refused(&forget(&*store, SCOPE, false).await, LEASE);
    h.advance(LEASE - Duration::from_secs(10)).await;
    assert_refused(
        &forget(&*store, SCOPE, false).await,
        Duration::from_secs(10),
    );
    assert!(inspect(&*store, SCOPE).await.expect("kept").holder_alive());
    assert!(renew(&*store, token, LEASE).await, "still the owner");
    assert!(complete(&*store, token, &response("a")).await);
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("a")));
}

/// A forced forget deletes a live claim: the original owner's `renew`, `complete` and
/// `release` then change nothing, also after a new request claimed the key as new.
pub async fn check_forced_forget_fences_the_owner(backend: Backend) {
    let (_h, store) = setup(backend).await;
    let old = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    let before = inspect(&*store, SCOPE).await.expect("in progress");
    assert_eq!(
        forget(&*store, SCOPE, true).await,
        ForgetOutcome::Forgotten(before)
    );
    assert!(!complete(&*store, old, &response("stale")).await);
    assert!(!renew(&*store, old, LEASE).await);
    assert!(!release(&*store, old).await);
    assert_eq!(
        inspect(&*store, SCOPE).await,
        None,
        "nothing was written back"
    );
    let new = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    assert!(!complete(&*store, old, &response("stale")).await);
    assert!(!release(&*store, old).await);
    assert!(complete(&*store, new, &response("new")).await);
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("new")));
}

/// A claim whose lease ran out (its owner crashed) is forgotten without force, and its
/// owner is fenced off.
pub async fn check_forget_after_the_lease_ran_out(backend: Backend) {
    let (h, store) = setup(backend).await;
    let old = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    h.advance(LEASE).await;
    match forget(&*store, SCOPE, false).await {
        ForgetOutcome::Forgotten(info) => {
            assert!(!in_progress(&info).1, "reported with its holder dead");
        }
        other => panic!("expected Forgotten, got {other:?}"),
    }
    assert!(!complete(&*store, old, &response("stale")).await);
    must_claim(&*store, SCOPE, KEY, fp(2)).await;
}

/// Forget of a key with no live record says so, for a key never claimed, released, or
/// expired (an expired record is removed too: the next claim is new, not a takeover).
pub async fn check_forget_of_nothing(backend: Backend) {
    let (h, store) = setup(backend).await;
    assert_eq!(forget(&*store, SCOPE, true).await, ForgetOutcome::NotFound);
    let token = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    assert!(release(&*store, token).await);
    assert_eq!(forget(&*store, SCOPE, false).await, ForgetOutcome::NotFound);
    let token = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    assert!(complete(&*store, token, &response("a")).await);
    h.advance(TTL).await;
    assert_eq!(forget(&*store, SCOPE, false).await, ForgetOutcome::NotFound);
    must_claim(&*store, SCOPE, KEY, fp(2)).await;
}

/// Forget in one scope leaves the same key of another scope alone.
pub async fn check_forget_is_scoped(backend: Backend) {
    const BOB: &str = "acct_bob";
    let (_h, store) = setup(backend).await;
    for scope in [SCOPE, BOB] {
        let token = must_claim(&*store, scope, KEY, fp(1)).await;
        assert!(
            store
                .complete(scope, KEY, token, &response(scope))
                .await
                .expect("complete")
        );
    }
    assert!(matches!(
        forget(&*store, SCOPE, true).await,
        ForgetOutcome::Forgotten(_)
    ));
    assert_eq!(inspect(&*store, SCOPE).await, None);
    assert!(inspect(&*store, BOB).await.is_some(), "bob's record stays");
    let (outcome, _) = claim_in(&*store, BOB, KEY, fp(1)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response(BOB)));
    must_claim(&*store, SCOPE, KEY, fp(1)).await;
}

/// 16 operators forgetting one completed record at once: exactly one deletes it, the
/// others find nothing.
pub async fn check_concurrent_forgets_delete_once(backend: Backend) {
    let (_h, store) = setup(backend).await;
    let token = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    assert!(complete(&*store, token, &response("a")).await);
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let store = Arc::clone(&store);
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                forget(&*store, SCOPE, false).await
            })
        })
        .collect();
    let mut forgotten = 0;
    for task in tasks {
        match task.await.expect("forget task") {
            ForgetOutcome::Forgotten(_) => forgotten += 1,
            ForgetOutcome::NotFound => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(forgotten, 1, "exactly one forget deletes the record");
    must_claim(&*store, SCOPE, KEY, fp(1)).await;
}

/// Forced forgets racing their owners' completions, on 32 keys at once: each pair ends
/// one of two ways — the forget first (the completion records nothing) or the completion
/// first (the forget deletes the completed record) — and the key is free either way.
pub async fn check_forget_racing_completion_is_consistent(backend: Backend) {
    let (_h, store) = setup(backend).await;
    let mut tokens = Vec::new();
    for i in 0..32 {
        tokens.push(must_claim(&*store, SCOPE, &format!("race-{i}"), fp(1)).await);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let mut tasks = Vec::new();
    for (i, token) in tokens.into_iter().enumerate() {
        let key = format!("race-{i}");
        let (s, b, k) = (Arc::clone(&store), Arc::clone(&barrier), key.clone());
        let completion = tokio::spawn(async move {
            b.wait().await;
            s.complete(SCOPE, &k, token, &response("raced"))
                .await
                .expect("complete")
        });
        let (s, b, k) = (Arc::clone(&store), Arc::clone(&barrier), key.clone());
        let forgetting = tokio::spawn(async move {
            b.wait().await;
            s.forget(SCOPE, &k, true).await.expect("forget")
        });
        tasks.push((key, completion, forgetting));
    }
    for (key, completion, forgetting) in tasks {
        let completed = completion.await.expect("complete task");
        let forgotten = forgetting.await.expect("forget task");
        match (completed, &forgotten) {
            (false, ForgetOutcome::Forgotten(info))
                if matches!(info.state, RecordState::InProgress { .. }) => {}
            (true, ForgetOutcome::Forgotten(info))
                if info.state == (RecordState::Completed { status: 201 }) => {}
            other => panic!("{key}: inconsistent outcome {other:?}"),
        }
        assert_eq!(
            store.inspect(SCOPE, &key).await.expect("inspect"),
            None,
            "{key}"
        );
    }
}
