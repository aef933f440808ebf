//! Conformance checks of recovery points: [`Store::record_step`] and the steps a claim,
//! a release, a completion, `inspect` and `forget` carry (the rules are in
//! [`crate::fenced::rules`]: `steps_survive`, `release`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::{
    Backend, KEY, LEASE, SCOPE, TTL, assert_in_progress, claim, complete, fp, must_claim, release,
    renew, response, setup,
};
use crate::store::{
    ClaimOutcome, ClaimRequest, FencingToken, ForgetOutcome, RecordState, RecordedStep, Store,
    Takeover,
};

/// A step named `name` whose output says `output`, recorded at a whole millisecond.
fn step(name: &str, output: &str) -> RecordedStep {
    RecordedStep {
        name: name.to_owned(),
        output: Bytes::from(output.to_owned()),
        recorded_at: UNIX_EPOCH + Duration::from_millis(1_764_000_000_000 + name.len() as u64),
    }
}

async fn record(store: &dyn Store, token: FencingToken, step: &RecordedStep) -> bool {
    store
        .record_step(SCOPE, KEY, token, step)
        .await
        .expect("record_step")
}

/// Claims `(SCOPE, KEY)` after its holder's lease ran out and asserts a `LeaseLost`
/// takeover that resumes with `steps`; returns the token.
async fn must_resume(store: &dyn Store, steps: &[RecordedStep]) -> FencingToken {
    let (outcome, token) = claim(store, fp(1)).await;
    assert_eq!(
        outcome,
        ClaimOutcome::Claimed {
            token,
            takeover: Some(Takeover::LeaseLost),
            steps: steps.to_vec(),
        },
        "expected a takeover that resumes with the recorded steps"
    );
    token
}

/// Steps recorded under the claim come back, in order and byte for byte, to the claim
/// that takes the record over after the lease ran out; that claim's own steps append to
/// them; a new key and a takeover of nothing recorded carry none.
pub async fn check_steps_recorded_come_back_to_a_takeover(backend: Backend) {
    let (h, store) = setup(backend).await;
    let first = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    let authorise = step("authorise", r#"{"authorisation":"auth_1"}"#);
    let ledger = step("ledger", r#"{"entry":42}"#);
    assert!(record(&*store, first, &authorise).await);
    assert!(record(&*store, first, &ledger).await);
    assert_in_progress(&claim(&*store, fp(1)).await.0, LEASE);
    h.advance(LEASE).await;
    let second = must_resume(&*store, &[authorise.clone(), ledger.clone()]).await;
    let receipt = step("receipt", r#"{"sent":true}"#);
    assert!(record(&*store, second, &receipt).await);
    h.advance(LEASE).await;
    must_resume(&*store, &[authorise, ledger, receipt]).await;
}

/// Outputs are bytes: empty, NUL and 0xFF bytes, non-UTF-8, a 255-byte name and a
/// 256 KiB output all round-trip.
pub async fn check_steps_outputs_round_trip_as_bytes(backend: Backend) {
    let (h, store) = setup(backend).await;
    let first = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    let large: Vec<u8> = (0..256 * 1024).map(|i| (i * 7 % 256) as u8).collect();
    let steps = [
        RecordedStep {
            name: "empty".to_owned(),
            output: Bytes::new(),
            recorded_at: UNIX_EPOCH,
        },
        RecordedStep {
            name: "binary".to_owned(),
            output: Bytes::from_static(&[0, 255, 0, 0xC3, 0x28, b'\'', b'"', b'\\', 0]),
            recorded_at: UNIX_EPOCH + Duration::from_millis(1),
        },
        RecordedStep {
            name: "n".repeat(crate::store::MAX_STEP_NAME),
            output: Bytes::from(large),
            recorded_at: SystemTime::UNIX_EPOCH + Duration::from_millis(4_102_444_800_000),
        },
        step("ünïcödé name", "{}"),
    ];
    for step in &steps {
        assert!(record(&*store, first, step).await, "{}", step.name);
    }
    h.advance(LEASE).await;
    must_resume(&*store, &steps).await;
}

/// Recording is fenced like `complete`: a token that never claimed, a token whose record
/// was taken over, a completed claim's and a forgotten claim's token record nothing, and
/// nothing they tried shows up later.
pub async fn check_steps_are_fenced_by_the_token(backend: Backend) {
    let (h, store) = setup(backend).await;
    assert!(
        !record(&*store, FencingToken::random(), &step("ghost", "1")).await,
        "no record: nothing owns it"
    );
    let first = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    assert!(
        !record(&*store, FencingToken::random(), &step("stranger", "1")).await,
        "another token does not own the claim"
    );
    assert!(record(&*store, first, &step("a", "first")).await);
    h.advance(LEASE).await;
    let second = must_resume(&*store, &[step("a", "first")]).await;
    assert!(
        !record(&*store, first, &step("b", "stale")).await,
        "the taken-over owner records nothing"
    );
    assert!(record(&*store, second, &step("b", "second")).await);
    // Steps of another scope and key are their own.
    let other = must_claim(&*store, "acct_bob", KEY, fp(1)).await;
    assert!(
        !store
            .record_step(SCOPE, KEY, other, &step("c", "bob"))
            .await
            .expect("record_step"),
        "a token records only under its own scope"
    );
    assert!(complete(&*store, second, &response("done")).await);
    assert!(
        !record(&*store, second, &step("c", "after")).await,
        "a completed claim records nothing"
    );
    assert_eq!(
        claim(&*store, fp(1)).await.0,
        ClaimOutcome::Replay(response("done"))
    );
    let bobs = store
        .inspect("acct_bob", KEY)
        .await
        .expect("inspect")
        .expect("bob's claim is live");
    assert!(bobs.steps.is_empty(), "{:?}", bobs.steps);
}

/// A release of a claim that recorded steps keeps them: the record stays in progress
/// with its lease ended, the same request takes it over at once and resumes, another
/// request is a mismatch; the released token owns nothing. A release of a claim with
/// no steps deletes it, as before. A watch on the key wakes for both.
pub async fn check_steps_release_keeps_the_recovery_point(backend: Backend) {
    const BOUND: Duration = Duration::from_secs(60);
    let (_h, store) = setup(backend).await;
    let first = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    let authorise = step("authorise", "auth_1");
    assert!(record(&*store, first, &authorise).await);
    let watch = store
        .capabilities()
        .watch_claim(SCOPE, KEY, Duration::from_millis(50));
    assert!(release(&*store, first).await);
    tokio::time::timeout(BOUND, watch)
        .await
        .expect("the watch resolves after a release that keeps the record");
    assert!(
        !release(&*store, first).await,
        "released twice: a release that keeps the record fences the released token (the \
         record's token becomes FencingToken::RELEASED)"
    );
    assert!(!record(&*store, first, &step("late", "x")).await);
    assert!(!renew(&*store, first, LEASE).await);
    assert!(!complete(&*store, first, &response("late")).await);
    let info = store
        .inspect(SCOPE, KEY)
        .await
        .expect("inspect")
        .expect("a released record with steps stays live");
    assert!(
        matches!(
            info.state,
            RecordState::InProgress {
                holder_alive: false,
                ..
            }
        ),
        "{info:?}"
    );
    assert_eq!(info.steps, vec![authorise.clone()]);
    assert_eq!(claim(&*store, fp(2)).await.0, ClaimOutcome::Mismatch);
    let second = must_resume(&*store, std::slice::from_ref(&authorise)).await;
    // Released again after one more step: still resumable, with both.
    let ledger = step("ledger", "entry_1");
    assert!(record(&*store, second, &ledger).await);
    assert!(release(&*store, second).await);
    let third = must_resume(&*store, &[authorise, ledger]).await;
    assert!(complete(&*store, third, &response("charged")).await);
    assert_eq!(
        claim(&*store, fp(1)).await.0,
        ClaimOutcome::Replay(response("charged"))
    );

    // Without steps, a release frees the key for any request.
    let other = "no-steps";
    let holder = must_claim(&*store, SCOPE, other, fp(1)).await;
    assert!(store.release(SCOPE, other, holder).await.expect("release"));
    assert!(
        store
            .inspect(SCOPE, other)
            .await
            .expect("inspect")
            .is_none(),
        "a released claim without steps is gone"
    );
    must_claim(&*store, SCOPE, other, fp(2)).await;
}

/// Completion replaces the steps with the response (inspect shows none), and a claim
/// after the TTL starts a new lifetime without them, as does a takeover of an in-progress
/// record whose TTL ran out.
pub async fn check_steps_end_with_completion_and_expiry(backend: Backend) {
    let (h, store) = setup(backend).await;
    let first = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    assert!(record(&*store, first, &step("authorise", "auth_1")).await);
    assert!(complete(&*store, first, &response("charged")).await);
    let info = store
        .inspect(SCOPE, KEY)
        .await
        .expect("inspect")
        .expect("live");
    assert!(
        matches!(info.state, RecordState::Completed { status: 201 }),
        "{info:?}"
    );
    assert!(info.steps.is_empty(), "{:?}", info.steps);
    h.advance(TTL).await;
    let (outcome, second) = claim(&*store, fp(1)).await;
    assert_eq!(
        outcome,
        ClaimOutcome::Claimed {
            token: second,
            takeover: Some(Takeover::Expired),
            steps: Vec::new(),
        }
    );
    // In progress with steps, lease and TTL both run out: a new lifetime, no steps,
    // for any request.
    assert!(record(&*store, second, &step("authorise", "auth_2")).await);
    h.advance(TTL).await;
    let (outcome, third) = claim(&*store, fp(2)).await;
    assert_eq!(
        outcome,
        ClaimOutcome::Claimed {
            token: third,
            takeover: Some(Takeover::Expired),
            steps: Vec::new(),
        }
    );
}

/// A handler that outlives its TTL while its heartbeat holds the lease, and then stops
/// without a release (its process was killed): its record lives on a TTL past its last
/// renewal, so the sweeper leaves it and the retry of the same request takes it over as
/// [`Takeover::LeaseLost`] and resumes after the recorded step instead of running it
/// again.
pub async fn check_steps_survive_a_crash_after_the_ttl(backend: Backend) {
    let (h, store) = setup(backend).await;
    let ttl = LEASE * 3;
    let token = FencingToken::random();
    let outcome = store
        .claim(&ClaimRequest {
            scope: SCOPE,
            key: KEY,
            fingerprint: &fp(1),
            ttl,
            lease: LEASE,
            token,
        })
        .await
        .expect("claim")
        .outcome;
    assert!(
        matches!(outcome, ClaimOutcome::Claimed { .. }),
        "{outcome:?}"
    );
    let authorise = step("authorise", "auth_1");
    assert!(record(&*store, token, &authorise).await);
    // The heartbeat renews every half lease until the handler has run 4.5 leases, past
    // the TTL of 3.
    for _ in 0..9 {
        h.advance(LEASE / 2).await;
        assert!(
            store
                .renew(SCOPE, KEY, token, LEASE, ttl)
                .await
                .expect("renew"),
            "the running owner renews"
        );
    }
    // Killed: no release, no more renewals. The lease runs out.
    h.advance(LEASE).await;
    assert_eq!(
        store.purge_expired(100).await.expect("purge"),
        0,
        "a record whose owner renewed within its TTL is not expired"
    );
    must_resume(&*store, &[authorise]).await;
}

/// `inspect` shows a running claim's steps (names, outputs, when); `forget` reports them
/// and deletes them with the record, so the next claim of the key starts without them.
pub async fn check_steps_inspect_and_forget(backend: Backend) {
    let (h, store) = setup(backend).await;
    let first = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    let steps = [step("authorise", "auth_1"), step("ledger", "entry_1")];
    for step in &steps {
        assert!(record(&*store, first, step).await);
    }
    let info = store
        .inspect(SCOPE, KEY)
        .await
        .expect("inspect")
        .expect("live");
    assert!(info.holder_alive());
    assert_eq!(info.steps, steps);
    assert!(matches!(
        store.forget(SCOPE, KEY, false).await.expect("forget"),
        ForgetOutcome::Refused { .. }
    ));
    h.advance(LEASE).await;
    match store.forget(SCOPE, KEY, false).await.expect("forget") {
        ForgetOutcome::Forgotten(info) => assert_eq!(info.steps, steps),
        other => panic!("expected Forgotten, got {other:?}"),
    }
    assert!(
        !record(&*store, first, &step("receipt", "x")).await,
        "forgotten: fenced"
    );
    must_claim(&*store, SCOPE, KEY, fp(1)).await;
}

/// Real concurrency: after the lease ran out, the old owner records a step while many
/// retries race to take the record over. Exactly one retry wins; whatever the old owner's
/// record answered, the winner's steps agree with it (a step acknowledged before the
/// takeover is in the winner's answer, one refused is not), and every loser, and the old
/// owner after the takeover, records nothing.
pub async fn check_steps_race_a_takeover(backend: Backend) {
    for round in 0..8 {
        let (h, store) = setup(backend).await;
        let key = format!("race-{round}");
        let old = super::must_claim(&*store, SCOPE, &key, fp(1)).await;
        let before = step("authorise", "auth_1");
        assert!(
            store
                .record_step(SCOPE, &key, old, &before)
                .await
                .expect("record_step")
        );
        h.advance(LEASE).await;
        let racing = step("ledger", "entry_1");
        let old_owner = {
            let (store, key, racing) = (store.clone(), key.clone(), racing.clone());
            tokio::spawn(async move {
                store
                    .record_step(SCOPE, &key, old, &racing)
                    .await
                    .expect("old owner's record_step")
            })
        };
        let retries: Vec<_> = (0..16)
            .map(|_| {
                let (store, key) = (store.clone(), key.clone());
                tokio::spawn(async move {
                    let (outcome, token) = super::claim_in(&*store, SCOPE, &key, fp(1)).await;
                    let recorded = store
                        .record_step(SCOPE, &key, token, &step("retry", "r"))
                        .await
                        .expect("retry's record_step");
                    (outcome, token, recorded)
                })
            })
            .collect();
        let old_recorded = old_owner.await.expect("old owner task");
        let mut winners = 0;
        for retry in retries {
            let (outcome, token, recorded) = retry.await.expect("retry task");
            match outcome {
                ClaimOutcome::Claimed {
                    token: won,
                    takeover,
                    steps,
                } => {
                    winners += 1;
                    assert_eq!(won, token);
                    assert_eq!(takeover, Some(Takeover::LeaseLost));
                    let mut expected = vec![before.clone()];
                    if old_recorded {
                        expected.push(racing.clone());
                    }
                    assert_eq!(
                        steps, expected,
                        "round {round}: the winner's steps disagree with the old owner's \
                         record_step answer ({old_recorded})"
                    );
                    assert!(recorded, "the winner records its own step");
                }
                other => {
                    assert_in_progress(&other, LEASE);
                    assert!(!recorded, "a retry that lost recorded a step");
                }
            }
        }
        assert_eq!(winners, 1, "round {round}: exactly one retry takes over");
        assert!(
            !store
                .record_step(SCOPE, &key, old, &step("late", "x"))
                .await
                .expect("record_step"),
            "the old owner records nothing after the takeover"
        );
        let info = store
            .inspect(SCOPE, &key)
            .await
            .expect("inspect")
            .expect("live");
        let names: Vec<_> = info.steps.iter().map(|s| s.name.as_str()).collect();
        let expected: &[&str] = if old_recorded {
            &["authorise", "ledger", "retry"]
        } else {
            &["authorise", "retry"]
        };
        assert_eq!(names, expected, "round {round}");
        drop(h);
    }
}

/// An at-most-once step records its intent (an empty output) before its call and its
/// output after, under one name: a store keeps both entries, in order, and `inspect`
/// names the steps whose intent has no output yet.
pub async fn check_steps_an_intent_and_its_output_both_come_back(backend: Backend) {
    let (h, store) = setup(backend).await;
    let first = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    let at = UNIX_EPOCH + Duration::from_millis(1_764_000_000_000);
    let charge_intent = RecordedStep::intent("charge", at);
    let charge = step("charge", r#""ch_1""#);
    let refund_intent = RecordedStep::intent("refund", at);
    assert!(record(&*store, first, &charge_intent).await);
    assert!(record(&*store, first, &charge).await);
    assert!(record(&*store, first, &refund_intent).await);
    let info = store
        .inspect(SCOPE, KEY)
        .await
        .expect("inspect")
        .expect("a live record");
    assert_eq!(info.unknown_outcomes(), vec!["refund"]);
    h.advance(LEASE).await;
    must_resume(&*store, &[charge_intent, charge, refund_intent]).await;
}

/// The old owner records steps from four tasks, each until it is fenced off, while a
/// retry takes the record over (its lease ran out), twenty rounds, every other one
/// through another instance ([`Harness::another_store`](super::Harness::another_store))
/// when the backend has one: the takeover answers exactly the steps whose `record_step`
/// said `true`, each task's in its own order, and the record holds what it answered;
/// a task fenced once stays fenced. A store that reads the steps before the takeover's
/// write (a snapshot, a stale version) misses those recorded in between.
pub async fn check_steps_recorded_until_a_takeover_are_its_answer(backend: Backend) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    const WRITERS: usize = 4;
    // Bounds each task, so that a store that never fences fails instead of hanging.
    const MAX_STEPS: usize = 5_000;
    let (h, store) = setup(backend).await;
    let other = h.another_store().await;
    for round in 0..20 {
        let key = format!("stream-{round}");
        let old = super::must_claim(&*store, SCOPE, &key, fp(1)).await;
        h.advance(LEASE).await;
        let taker = match &other {
            Some(other) if round % 2 == 1 => Arc::clone(other),
            _ => Arc::clone(&store),
        };
        let acknowledged = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(tokio::sync::Barrier::new(WRITERS + 1));
        let writers: Vec<_> = (0..WRITERS)
            .map(|writer| {
                let (store, key, acknowledged, barrier) = (
                    Arc::clone(&store),
                    key.clone(),
                    Arc::clone(&acknowledged),
                    Arc::clone(&barrier),
                );
                tokio::spawn(async move {
                    barrier.wait().await;
                    let mut recorded = Vec::new();
                    for n in 0..MAX_STEPS {
                        // Bytes a text path would mangle: NUL, 0xFF, invalid UTF-8.
                        let step = RecordedStep {
                            name: format!("w{writer}-{n}"),
                            output: Bytes::from(vec![0, 0xFF, n as u8, 0xC3, 0x28, 0]),
                            recorded_at: UNIX_EPOCH + Duration::from_millis(n as u64),
                        };
                        let taken = store
                            .record_step(SCOPE, &key, old, &step)
                            .await
                            .expect("the old owner's record_step");
                        if !taken {
                            let again = step.clone();
                            let taken = store.record_step(SCOPE, &key, old, &again).await;
                            assert!(!taken.expect("record_step"), "fenced once, fenced for good");
                            return recorded;
                        }
                        recorded.push(step);
                        acknowledged.fetch_add(1, Ordering::SeqCst);
                        // Lets the retry in on a store whose writes never wait.
                        tokio::task::yield_now().await;
                    }
                    panic!("writer {writer} was never fenced off");
                })
            })
            .collect();
        barrier.wait().await;
        // The takeover lands while the steps are being recorded, after some of them.
        while acknowledged.load(Ordering::SeqCst) < WRITERS {
            tokio::task::yield_now().await;
        }
        let (outcome, retry) = super::claim_in(&*taker, SCOPE, &key, fp(1)).await;
        let ClaimOutcome::Claimed {
            token,
            takeover: Some(Takeover::LeaseLost),
            steps,
        } = outcome
        else {
            panic!("round {round}: expected a lease-lost takeover, got {outcome:?}");
        };
        assert_eq!(token, retry);
        for (writer, task) in writers.into_iter().enumerate() {
            let recorded = task.await.expect("writer task");
            let prefix = format!("w{writer}-");
            let answered: Vec<_> = steps
                .iter()
                .filter(|step| step.name.starts_with(&prefix))
                .cloned()
                .collect();
            assert_eq!(
                answered, recorded,
                "round {round}: writer {writer}'s steps in the takeover's answer"
            );
        }
        let info = store
            .inspect(SCOPE, &key)
            .await
            .expect("inspect")
            .expect("live");
        assert_eq!(
            info.steps, steps,
            "round {round}: the record holds its answer"
        );
    }
}
