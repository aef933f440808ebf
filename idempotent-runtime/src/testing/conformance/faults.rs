//! The fault section: two engines over one store, one of them seeing it through a
//! [`Faulty`] decorator, driven through late answers, refused and lost operations. Each
//! check asserts that the handler ran at most once for the key and that no recorded
//! answer was lost. They run on real time with short leases (the engines' clocks cannot
//! be paused on a multi-thread runtime), moving the store's clock with
//! [`Harness::advance`] where a lease has to run out.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::StatusCode;

use super::{
    Backend, Instance, KEY, SCOPE, assert_in_progress, claim, complete, fp, must_claim,
    must_take_over, renew, response, setup,
};
use crate::config::HandlerConfig;
use crate::engine::Idempotency;
use crate::store::{Store, Takeover};
use crate::testing::faults::{Fault, Faulty, Operation};

/// The lease the fault checks' engines use: short, so that they run on real time.
const LEASE: Duration = Duration::from_millis(400);

const CONFIG: HandlerConfig = HandlerConfig::new();

/// An engine over `store` with the checks' lease, no replay cache (every answer comes
/// from the store) and a short completion retry window.
fn engine(store: Arc<dyn Store>) -> Idempotency {
    Idempotency::builder_shared(store)
        .default_lease(LEASE)
        .completion_retry_window(Duration::from_millis(100))
        .replay_cache(None)
        .build()
}

/// Runs a request for the key on `engine`; the handler counts its runs in `runs`.
async fn request(engine: &Idempotency, runs: &Arc<AtomicUsize>) -> Response {
    let runs = runs.clone();
    engine
        .run(&CONFIG, SCOPE, KEY, fp(1), move |_key| async move {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            (StatusCode::CREATED, format!("run {run}")).into_response()
        })
        .await
}

fn replayed(response: &Response) -> bool {
    response
        .headers()
        .contains_key(crate::engine::REPLAYED_HEADER)
}

/// Lets `total` of real time pass while the store's clock runs at twice the speed (it
/// is advanced by each step as well), so leases run out in the store twice as fast as
/// the engines see: a renewing holder keeps its lease, one that stopped loses it.
async fn pass_double_time(harness: &dyn Instance, total: Duration) {
    let step = LEASE / 8;
    let mut passed = Duration::ZERO;
    while passed < total {
        tokio::time::sleep(step).await;
        harness.advance(step).await;
        passed += step;
    }
}

/// Interleaving 1 of the protocol review: engine A's claim is applied at once but
/// answered after its lease could have run out; a retry on engine B took the key over
/// and ran meanwhile. A must not run too: it answers `503`, and its release is fenced.
pub async fn check_fault_claim_answered_late_does_not_run(backend: Backend) {
    let (harness, store) = setup(backend).await;
    let faulty = Arc::new(Faulty::new(store.clone()));
    let (a, b) = (engine(faulty.clone()), engine(store));
    faulty.inject(Operation::Claim, Fault::DelayAnswer(LEASE + LEASE / 2));
    let runs = Arc::new(AtomicUsize::new(0));
    let first = tokio::spawn({
        let (a, runs) = (a.clone(), runs.clone());
        async move { request(&a, &runs).await }
    });
    // The claim is applied, its answer held back; then its lease runs out in the store.
    tokio::time::sleep(LEASE / 4).await;
    harness.advance(LEASE * 2).await;
    let retry = request(&b, &runs).await;
    assert_eq!(retry.status(), StatusCode::CREATED, "the retry takes over");
    let first = first.await.expect("A's request");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran twice");
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
    let replay = request(&b, &runs).await;
    assert!(
        replayed(&replay),
        "B's record stands after A's late release"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A claim the store applied but whose answer was lost: the engine answers `503` and
/// runs nothing; the key is in progress until the lease runs out, then a retry runs it
/// once.
pub async fn check_fault_claim_applied_but_failed_runs_once(backend: Backend) {
    let (harness, store) = setup(backend).await;
    let faulty = Arc::new(Faulty::new(store.clone()));
    let (a, b) = (engine(faulty.clone()), engine(store));
    faulty.inject(Operation::Claim, Fault::FailAfterApplying);
    let runs = Arc::new(AtomicUsize::new(0));
    let first = request(&a, &runs).await;
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let during = request(&b, &runs).await;
    assert_eq!(
        during.status(),
        StatusCode::CONFLICT,
        "the lost claim holds the key"
    );
    harness.advance(LEASE * 2).await;
    let retry = request(&b, &runs).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A completion the store applied but whose answer was lost: the engine's next attempt
/// finds the record completed; the retry replays it, nothing runs twice.
pub async fn check_fault_completion_applied_but_failed_is_kept(backend: Backend) {
    let (_harness, store) = setup(backend).await;
    let faulty = Arc::new(Faulty::new(store.clone()));
    let (a, b) = (engine(faulty.clone()), engine(store));
    faulty.inject(Operation::Complete, Fault::FailAfterApplying);
    let runs = Arc::new(AtomicUsize::new(0));
    let first = request(&a, &runs).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let replay = request(&b, &runs).await;
    assert!(replayed(&replay), "the applied completion is the record");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The completion case of the review: the store applies renewals but refuses every
/// completion. The engine holding the lease keeps trying past its retry window, so a
/// retry gets `409` rather than a second run; once completions go through, it replays.
pub async fn check_fault_refused_completions_keep_the_key(backend: Backend) {
    let (harness, store) = setup(backend).await;
    let faulty = Arc::new(Faulty::new(store.clone()));
    let (a, b) = (engine(faulty.clone()), engine(store));
    faulty.inject_always(Operation::Complete, Fault::Fail);
    let runs = Arc::new(AtomicUsize::new(0));
    let first = request(&a, &runs).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    // Past the retry window, for more than a lease of the store's time.
    pass_double_time(&*harness, LEASE * 2).await;
    let retry = request(&b, &runs).await;
    assert_eq!(
        retry.status(),
        StatusCode::CONFLICT,
        "the holder gave the key up"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    faulty.heal();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let replay = request(&b, &runs).await;
        if replayed(&replay) {
            break;
        }
        assert_eq!(replay.status(), StatusCode::CONFLICT);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the response was never recorded once the store took completions again"
        );
        tokio::time::sleep(LEASE / 8).await;
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Issue 44's crash, through two engines: engine A's handler records a step and keeps
/// running, renewing its lease, past its TTL; then A stops (its process killed: no
/// renewal, completion or release reaches the store again). Once A's lease ran out, the
/// retry of the same request on engine B takes the record over and resumes after the
/// recorded step: the step's side effect happened once.
pub async fn check_fault_crash_after_the_ttl_resumes_the_steps(backend: Backend) {
    let (harness, store) = setup(backend).await;
    let faulty = Arc::new(Faulty::new(store.clone()));
    let (a, b) = (engine(faulty.clone()), engine(store));
    let config = HandlerConfig::new().ttl(LEASE.saturating_mul(3));
    let authorised = Arc::new(AtomicUsize::new(0));
    let charge = |engine: Idempotency, keeps_running: bool| {
        let authorised = authorised.clone();
        async move {
            engine
                .run(&config, SCOPE, KEY, fp(1), move |key| async move {
                    let authorisation = key
                        .step("authorise", || async {
                            let n = authorised.fetch_add(1, Ordering::SeqCst) + 1;
                            Ok::<_, StatusCode>(format!("auth_{n}"))
                        })
                        .await;
                    if keeps_running {
                        std::future::pending::<()>().await;
                    }
                    match authorisation {
                        Ok(authorisation) => (StatusCode::CREATED, authorisation).into_response(),
                        Err(error) => error.into_response(),
                    }
                })
                .await
        }
    };
    let first = tokio::spawn(charge(a, true));
    // Bounded so that an engine that never runs the handler fails the check, not hangs it.
    let waited_for_step = tokio::time::timeout(Duration::from_secs(30), async {
        while authorised.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(LEASE / 16).await;
        }
    });
    assert!(
        waited_for_step.await.is_ok(),
        "engine A never ran the handler's step"
    );
    // A keeps running for five leases of the store's time, past its TTL of three, and
    // keeps its lease by renewing.
    pass_double_time(&*harness, LEASE.saturating_mul(5)).await;
    // Killed: nothing of A reaches the store any more. Its lease runs out.
    for operation in [Operation::Renew, Operation::Complete, Operation::Release] {
        faulty.inject_always(operation, Fault::Hang);
    }
    harness.advance(LEASE.saturating_mul(2)).await;
    let retry = charge(b, false).await;
    first.abort();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(
        authorised.load(Ordering::SeqCst),
        1,
        "the retry resumed after the recorded step instead of running it again"
    );
}

/// Interleaving 3 of the protocol review, on a store that keeps time in this process: a
/// forward step of the wall clock larger than the lease (NTP, a VM resumed) does not
/// expire a live lease, so a retry gets `409` and the owner keeps renewing; it moves the
/// TTL, which is calendar time. Nothing to step on a store whose clock is a server's.
pub async fn check_fault_forward_wall_step_keeps_a_live_lease(backend: Backend) {
    let (h, store) = setup(backend).await;
    let token = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    if !h.step_wall(60_000).await {
        return;
    }
    let (retry, _) = claim(&*store, fp(1)).await;
    assert_in_progress(&retry, super::LEASE);
    assert!(
        renew(&*store, token, super::LEASE).await,
        "the owner lost its claim to a wall step"
    );
    assert!(complete(&*store, token, &response("owner")).await);
    // The TTL is calendar time: a step past it expires the record.
    let past_the_ttl = i64::try_from(super::TTL.as_millis()).expect("an hour in milliseconds");
    assert!(h.step_wall(past_the_ttl).await);
    must_take_over(&*store, fp(2), Takeover::Expired).await;
}

/// A backward step of the wall clock does not keep a crashed owner's lease alive: the
/// lease still runs out one lease after it was granted.
pub async fn check_fault_backward_wall_step_keeps_no_lease_alive(backend: Backend) {
    let (h, store) = setup(backend).await;
    let _crashed = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    if !h.step_wall(-60_000).await {
        return;
    }
    h.advance(super::LEASE).await;
    must_take_over(&*store, fp(1), Takeover::LeaseLost).await;
}

/// An at-most-once step called its provider, and then the store became unreachable: its
/// output was not recorded and its claim not released. Once the lease has run out, the
/// retry finds the intent without an output and asks `verify` instead of calling again:
/// one call, and the request completes with the verified output.
pub async fn check_fault_an_unrecorded_at_most_once_call_is_verified_not_repeated(
    backend: Backend,
) {
    let (harness, store) = setup(backend).await;
    let faulty = Arc::new(Faulty::new(store));
    let engine = engine(faulty.clone());
    let (calls, verifies) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let charge = || {
        let (faulty, calls, verifies) = (faulty.clone(), calls.clone(), verifies.clone());
        engine.run(&CONFIG, SCOPE, KEY, fp(1), move |key| async move {
            let authorised = key
                .step_at_most_once(
                    "authorise",
                    || async {
                        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                        // The store goes away between the provider's answer and its record.
                        faulty.inject_always(Operation::RecordStep, Fault::Fail);
                        faulty.inject_always(Operation::Release, Fault::Fail);
                        Ok::<_, StatusCode>(format!("auth_{n}"))
                    },
                    || async {
                        verifies.fetch_add(1, Ordering::SeqCst);
                        let made = calls.load(Ordering::SeqCst);
                        Ok(crate::steps::Verified::Happened(format!("auth_{made}")))
                    },
                )
                .await;
            match authorised {
                Ok(authorisation) => (StatusCode::CREATED, authorisation).into_response(),
                Err(error) => error.into_response(),
            }
        })
    };
    let first = charge().await;
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
    faulty.heal();
    harness.advance(LEASE.saturating_mul(2)).await;
    let retry = charge().await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(
        (
            calls.load(Ordering::SeqCst),
            verifies.load(Ordering::SeqCst)
        ),
        (1, 1),
        "the retry verified the call instead of making it again"
    );
}

/// An at-most-once step whose output was lost and whose `verify` cannot tell fails
/// closed on every retry (`500 step_outcome_unknown`, the call not made again), the
/// record naming the step; once an operator resolves it, the next retry resumes with
/// the operator's output.
pub async fn check_fault_an_unknown_outcome_fails_closed_until_resolved(backend: Backend) {
    let (_harness, store) = setup(backend).await;
    let faulty = Arc::new(Faulty::new(store));
    let engine = engine(faulty.clone());
    let calls = Arc::new(AtomicUsize::new(0));
    let charge = || {
        let (faulty, calls) = (faulty.clone(), calls.clone());
        engine.run(&CONFIG, SCOPE, KEY, fp(1), move |key| async move {
            let authorised = key
                .step_at_most_once(
                    "authorise",
                    || async {
                        calls.fetch_add(1, Ordering::SeqCst);
                        // The output's record is lost; the claim is released.
                        faulty.inject(Operation::RecordStep, Fault::Fail);
                        Ok::<_, StatusCode>("auth_1".to_owned())
                    },
                    crate::steps::cannot_verify,
                )
                .await;
            match authorised {
                Ok(authorisation) => (StatusCode::CREATED, authorisation).into_response(),
                Err(error) => error.into_response(),
            }
        })
    };
    assert_eq!(charge().await.status(), StatusCode::SERVICE_UNAVAILABLE);
    for _ in 0..2 {
        let refused = charge().await;
        assert_eq!(refused.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "never called blindly again"
    );
    let info = engine
        .inspect(SCOPE, KEY)
        .await
        .expect("inspect")
        .expect("a live record");
    assert_eq!(info.unknown_outcomes(), vec!["authorise"]);
    let resolved = engine
        .resolve_step(SCOPE, KEY, "authorise", &serde_json::json!("auth_checked"))
        .await
        .expect("resolve");
    assert_eq!(resolved, crate::engine::ResolveOutcome::Resolved);
    let resumed = charge().await;
    assert_eq!(resumed.status(), StatusCode::CREATED);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
