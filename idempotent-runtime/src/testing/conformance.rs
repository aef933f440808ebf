//! The conformance suite every [`Store`] must pass.
//!
//! A backend implements [`Harness`] (a fresh, empty store per check, and a way to move
//! its clock) and runs [`trials`] — in one line, from a test target with
//! `harness = false`:
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use idempotent_runtime::store::MemoryStore;
//! use idempotent_runtime::testing::conformance::{self, Harness};
//! use idempotent_runtime::Store;
//! use idempotent_runtime::clock::ManualClock;
//!
//! struct MyHarness {
//!     store: Arc<MemoryStore>,
//!     clock: ManualClock,
//! }
//!
//! #[async_trait::async_trait]
//! impl Harness for MyHarness {
//!     async fn new() -> Self {
//!         let clock = ManualClock::new();
//!         let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
//!         Self { store, clock }
//!     }
//!
//!     fn store(&self) -> Arc<dyn Store> {
//!         self.store.clone()
//!     }
//!
//!     async fn advance(&self, by: Duration) {
//!         self.clock.advance(by);
//!     }
//! }
//!
//! fn main() {
//!     conformance::run::<MyHarness>()
//! }
//! ```
//!
//! Each check is its own test (named `conformance::check_…`), runs on a multi-thread
//! Tokio runtime of its own (concurrency checks race real threads), starts from a fresh
//! store and moves time only through [`Harness::advance`]. To add tests of your own to
//! the same binary, chain [`trials`] with them (e.g. made by
//! [`async_trial`](super::async_trial)) and pass them all to [`testing::run`](super::run).
//!
//! The checks named `check_fault_…` drive two engines over the store, one through a
//! [`Faulty`](super::faults::Faulty) decorator (late answers, lost answers, refused
//! completions), and assert that the handler runs at most once per key and that no
//! recorded answer is lost: the engine's lease rule holds on every store. A store that
//! keeps its clock in this process also implements [`Harness::step_wall`], and the
//! clock-step checks assert that a step of the wall clock moves TTLs but never a lease.
//! A store whose records live outside it (in a database, a file or a server) also
//! implements [`Harness::another_store`], and the checks named `check_instances_…` race
//! several stores on those records, as the instances of an app share one database.
//!
//! Semantics pinned here (the [`Store`] docs say the rest):
//!
//! - A record is live while `now < expires_at`; at `expires_at` it is gone (any request
//!   may claim the key, whatever its fingerprint).
//! - A lease is held while `now < lease_expires_at`; after that, only a request with the
//!   same fingerprint (digest *and* version) takes the claim over.
//! - A claim says whether it took over an earlier record, and why
//!   ([`Takeover::Expired`] before [`Takeover::LeaseLost`]); a key whose record was
//!   released or purged is claimed as new.
//! - A token acts (`renew`/`complete`/`release`) only while it owns an *in-progress*
//!   record; a lease that ran out without a takeover is still owned. After completion the
//!   token owns nothing: a second `complete` returns `false` and changes nothing.
//! - `inspect` reports only a live record (an expired one is `None`), with its holder
//!   alive exactly while its lease is held; `forget` deletes a completed record or one
//!   whose lease ran out, refuses a held lease unless forced, fences the forgotten
//!   claim's token, and makes the next claim of the key a new one (no takeover).
//! - Recovery points (`check_steps_…`): `record_step` is fenced like `complete`; a
//!   takeover of a lost lease returns the steps recorded before it, in order and byte for
//!   byte, and an expired record's steps are gone; a release keeps a record with steps (in
//!   progress, lease ended: the same request resumes, another is a mismatch) and deletes
//!   one without; completion and `forget` drop them; `inspect` shows them.
//! - The typed entry point ([`Idempotency::once`](crate::Idempotency::once),
//!   `check_function_…`): a function runs once per key and payload across engines, and
//!   its typed output comes back from the store's bytes to every duplicate.
//! - The store's capabilities agree with its behaviour: a store that keeps its clock in
//!   this process gives it, an in-process store gives a clock, and records expire by the
//!   clock given ([`check_capabilities_are_consistent`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::Trial;

mod faults;
mod function;
mod instances;
mod operator;
mod records;
mod steps;

use crate::fingerprint::Fingerprint;
use crate::store::{
    ClaimAnswer, ClaimOutcome, ClaimRequest, FencingToken, ForgetOutcome, RecordedStep, Store,
    StoredResponse, Takeover,
};
pub use faults::{
    check_fault_an_unknown_outcome_fails_closed_until_resolved,
    check_fault_an_unrecorded_at_most_once_call_is_verified_not_repeated,
    check_fault_backward_wall_step_keeps_no_lease_alive,
    check_fault_claim_answered_late_does_not_run, check_fault_claim_applied_but_failed_runs_once,
    check_fault_completion_applied_but_failed_is_kept,
    check_fault_crash_after_the_ttl_resumes_the_steps,
    check_fault_forward_wall_step_keeps_a_live_lease, check_fault_refused_completions_keep_the_key,
};
pub use function::check_function_runs_once_and_replays_its_output;
pub use instances::{
    check_instances_claims_racing_fenced_writes_never_fail,
    check_instances_concurrent_claims_one_winner,
    check_instances_steps_racing_takeovers_are_answered_or_fenced,
};
pub use operator::{
    check_concurrent_forgets_delete_once, check_forced_forget_fences_the_owner,
    check_forget_after_the_lease_ran_out, check_forget_completed_lets_the_key_run_as_new,
    check_forget_is_scoped, check_forget_of_nothing, check_forget_racing_completion_is_consistent,
    check_forget_refuses_a_live_claim, check_inspect_reports_each_state,
};
pub use records::{RecordsHarness, check_records_delete_many_deletes_the_versions_read};
pub use steps::{
    check_steps_an_intent_and_its_output_both_come_back, check_steps_are_fenced_by_the_token,
    check_steps_end_with_completion_and_expiry, check_steps_inspect_and_forget,
    check_steps_outputs_round_trip_as_bytes, check_steps_race_a_takeover,
    check_steps_recorded_come_back_to_a_takeover,
    check_steps_recorded_until_a_takeover_are_its_answer,
    check_steps_release_keeps_the_recovery_point, check_steps_survive_a_crash_after_the_ttl,
};

/// A backend under test.
#[async_trait::async_trait]
pub trait Harness: Send + Sync + Sized + 'static {
    /// Why this backend cannot be tested here (e.g. the variable naming its server is not
    /// set); `None` (the default) when it can. With a reason, every check is reported
    /// *ignored* by `cargo test`, and the reason is printed once.
    fn unavailable() -> Option<String> {
        None
    }

    /// A fresh, empty store isolated from every other check (which may run at the same
    /// time, on other threads).
    async fn new() -> Self;

    /// The store under test.
    fn store(&self) -> Arc<dyn Store>;

    /// Moves the store's notion of "now" forward by `by` (e.g. advance a
    /// [`ManualClock`](crate::clock::ManualClock), or shift a database's stored timestamps back).
    async fn advance(&self, by: Duration);

    /// Steps the wall clock the store keeps in this process by `by_millis` (negative:
    /// backwards) with no time passing, as NTP or a resumed VM does (e.g.
    /// [`ManualClock::step_wall`](crate::clock::ManualClock::step_wall)), and returns `true`.
    /// `false` (the default): the store keeps no clock in this process (a database
    /// server judges leases and TTLs on its own clock, which a step moves alike), and
    /// the clock-step checks have nothing to step.
    async fn step_wall(&self, by_millis: i64) -> bool {
        let _ = by_millis;
        false
    }

    /// Opens another store on this backend that shares [`store`](Harness::store)'s
    /// records, as a second instance of an app does: its own pool, connection or client
    /// onto the same database, file or server. Each call opens a new one. `None` (the
    /// default): the backend has no such store (a memory store's records live in the
    /// store itself), and the checks of several instances (`check_instances_…`) pass
    /// without racing anything; every store on a shared database, file or server should
    /// give one.
    async fn another_store(&self) -> Option<Arc<dyn Store>> {
        None
    }
}

type Check = fn(Backend) -> Pin<Box<dyn Future<Output = ()>>>;

/// Lists the checks with their names, as `fn` pointers.
macro_rules! checks {
    ($($check:ident),+ $(,)?) => {
        [$((stringify!($check), (|backend| Box::pin($check(backend)) as Pin<Box<dyn Future<Output = ()>>>) as Check)),+]
    };
}

/// A harness as the checks hold it: [`Harness`] without its constructor, so that it can
/// sit behind a pointer.
#[async_trait::async_trait]
trait Instance: Send + Sync {
    fn store(&self) -> Arc<dyn Store>;
    async fn advance(&self, by: Duration);
    async fn step_wall(&self, by_millis: i64) -> bool;
    async fn another_store(&self) -> Option<Arc<dyn Store>>;
}

#[async_trait::async_trait]
impl<H: Harness> Instance for H {
    fn store(&self) -> Arc<dyn Store> {
        Harness::store(self)
    }

    async fn advance(&self, by: Duration) {
        Harness::advance(self, by).await;
    }

    async fn step_wall(&self, by_millis: i64) -> bool {
        Harness::step_wall(self, by_millis).await
    }

    async fn another_store(&self) -> Option<Arc<dyn Store>> {
        Harness::another_store(self).await
    }
}

/// The backend a check runs on: makes a fresh [`Harness`] of it for each store the check
/// needs.
///
/// The checks take a `Backend`, not a type parameter, so each is compiled once in this
/// crate, not once per backend in every test binary that runs the suite.
#[derive(Clone, Copy)]
pub struct Backend {
    new: fn() -> NewInstance,
}

/// A harness being made, as [`Backend`] hands it out.
type NewInstance = Pin<Box<dyn Future<Output = Box<dyn Instance>> + Send>>;

impl Backend {
    /// The backend of harness `H`.
    pub fn of<H: Harness>() -> Self {
        Self {
            new: || Box::pin(async { Box::new(H::new().await) as Box<dyn Instance> }),
        }
    }
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").finish_non_exhaustive()
    }
}

/// Every conformance check for backend `H`, one test each, marked ignored when
/// [`Harness::unavailable`] gives a reason.
pub fn trials<H: Harness>() -> Vec<Trial> {
    let checks = checks![
        check_claim_complete_replay,
        check_mismatch_while_in_progress,
        check_mismatch_when_completed,
        check_mismatch_on_fingerprint_version,
        check_in_progress_retry_after,
        check_ttl_takeover_of_completed,
        check_ttl_takeover_of_in_progress,
        check_lease_takeover_same_fingerprint,
        check_lease_takeover_refused_for_other_fingerprint,
        check_takeover_reasons,
        check_stale_token_changes_nothing,
        check_unknown_token_changes_nothing,
        check_release_lets_next_request_claim,
        check_renew_extends_lease,
        check_renew_keeps_a_running_claim_past_its_ttl,
        check_owner_keeps_expired_lease_until_taken_over,
        check_concurrent_claims_one_winner,
        check_concurrent_takeover_one_winner,
        check_concurrent_distinct_keys_all_claimed,
        check_claims_racing_releases_never_share_a_key,
        check_claims_racing_fenced_writes_never_fail,
        check_instances_concurrent_claims_one_winner,
        check_instances_claims_racing_fenced_writes_never_fail,
        check_instances_steps_racing_takeovers_are_answered_or_fenced,
        check_scope_isolation,
        check_keys_compared_exactly,
        check_long_keys_and_scopes,
        check_headers_and_large_body_round_trip,
        check_body_none_and_empty_round_trip,
        check_purge_expired,
        check_purge_expired_past_one_statement,
        check_complete_twice,
        check_inspect_reports_each_state,
        check_forget_completed_lets_the_key_run_as_new,
        check_forget_refuses_a_live_claim,
        check_forced_forget_fences_the_owner,
        check_forget_after_the_lease_ran_out,
        check_forget_of_nothing,
        check_forget_is_scoped,
        check_concurrent_forgets_delete_once,
        check_forget_racing_completion_is_consistent,
        check_watch_wakes_after_complete_and_release,
        check_capabilities_are_consistent,
        check_replay_life_bounds_the_record,
        check_fault_claim_answered_late_does_not_run,
        check_fault_claim_applied_but_failed_runs_once,
        check_fault_completion_applied_but_failed_is_kept,
        check_fault_refused_completions_keep_the_key,
        check_fault_forward_wall_step_keeps_a_live_lease,
        check_fault_backward_wall_step_keeps_no_lease_alive,
        check_fault_crash_after_the_ttl_resumes_the_steps,
        check_fault_an_unrecorded_at_most_once_call_is_verified_not_repeated,
        check_fault_an_unknown_outcome_fails_closed_until_resolved,
        check_steps_recorded_come_back_to_a_takeover,
        check_steps_outputs_round_trip_as_bytes,
        check_steps_are_fenced_by_the_token,
        check_steps_release_keeps_the_recovery_point,
        check_steps_end_with_completion_and_expiry,
        check_steps_inspect_and_forget,
        check_steps_race_a_takeover,
        check_steps_recorded_until_a_takeover_are_its_answer,
        check_steps_survive_a_crash_after_the_ttl,
        check_steps_an_intent_and_its_output_both_come_back,
        check_function_runs_once_and_replays_its_output,
    ];
    let backend = Backend::of::<H>();
    let trials = checks
        .into_iter()
        .map(|(name, check)| {
            super::async_trial(format!("conformance::{name}"), move || check(backend))
        })
        .collect();
    super::ignored_if(H::unavailable(), trials)
}

/// The checks of the record seam ([`RecordsHarness`]) for backend `H`, one test each,
/// marked ignored as [`trials`] are; a store on the seam runs them besides [`trials`].
pub fn record_trials<H: RecordsHarness>() -> Vec<Trial> {
    let trials = vec![super::async_trial(
        "conformance::check_records_delete_many_deletes_the_versions_read",
        check_records_delete_many_deletes_the_versions_read::<H>,
    )];
    super::ignored_if(H::unavailable(), trials)
}

/// The whole test binary for backend `H`: runs [`trials`] and exits.
pub fn run<H: Harness>() -> ! {
    super::run(trials::<H>())
}

const SCOPE: &str = "acct_alice";
const KEY: &str = "8e03978e-40d5-43e8-bc93-6894a57f9324";
const TTL: Duration = Duration::from_secs(3600);
const LEASE: Duration = Duration::from_secs(30);

async fn setup(backend: Backend) -> (Box<dyn Instance>, Arc<dyn Store>) {
    let harness = (backend.new)().await;
    let store = harness.store();
    (harness, store)
}

fn fp(n: u8) -> Fingerprint {
    Fingerprint {
        version: 1,
        digest: [n; 32],
    }
}

fn response(tag: &str) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![
            ("content-type".to_owned(), b"application/json".to_vec()),
            (
                "location".to_owned(),
                format!("/payments/{tag}").into_bytes(),
            ),
        ],
        body: Some(Bytes::from(format!(r#"{{"id":"{tag}"}}"#))),
    }
}

async fn claim_with(
    store: &dyn Store,
    scope: &str,
    key: &str,
    fingerprint: Fingerprint,
    token: FencingToken,
) -> ClaimOutcome {
    store
        .claim(&ClaimRequest {
            scope,
            key,
            fingerprint: &fingerprint,
            ttl: TTL,
            lease: LEASE,
            token,
        })
        .await
        .expect("claim")
        .outcome
}

/// Claims `(scope, key)` with a fresh token; returns the outcome and that token.
async fn claim_in(
    store: &dyn Store,
    scope: &str,
    key: &str,
    fingerprint: Fingerprint,
) -> (ClaimOutcome, FencingToken) {
    let token = FencingToken::random();
    (
        claim_with(store, scope, key, fingerprint, token).await,
        token,
    )
}

async fn claim(store: &dyn Store, fingerprint: Fingerprint) -> (ClaimOutcome, FencingToken) {
    claim_in(store, SCOPE, KEY, fingerprint).await
}

/// Claims a key with no live record and asserts the claim was won as a new claim (no
/// takeover); returns the token.
async fn must_claim(
    store: &dyn Store,
    scope: &str,
    key: &str,
    fingerprint: Fingerprint,
) -> FencingToken {
    let (outcome, token) = claim_in(store, scope, key, fingerprint).await;
    assert_eq!(
        outcome,
        ClaimOutcome::Claimed {
            token,
            takeover: None,
            steps: Vec::new(),
        },
        "expected ({scope}, {key}) to be claimed as new"
    );
    token
}

/// Claims `(SCOPE, KEY)` and asserts the claim took over the earlier record for
/// `reason`; returns the token.
async fn must_take_over(
    store: &dyn Store,
    fingerprint: Fingerprint,
    reason: Takeover,
) -> FencingToken {
    let (outcome, token) = claim(store, fingerprint).await;
    assert_eq!(
        outcome,
        ClaimOutcome::Claimed {
            token,
            takeover: Some(reason),
            steps: Vec::new(),
        },
        "expected a takeover ({reason})"
    );
    token
}

async fn complete(store: &dyn Store, token: FencingToken, response: &StoredResponse) -> bool {
    store
        .complete(SCOPE, KEY, token, response)
        .await
        .expect("complete")
}

async fn release(store: &dyn Store, token: FencingToken) -> bool {
    store.release(SCOPE, KEY, token).await.expect("release")
}

async fn renew(store: &dyn Store, token: FencingToken, lease: Duration) -> bool {
    store
        .renew(SCOPE, KEY, token, lease, TTL)
        .await
        .expect("renew")
}

fn assert_in_progress(outcome: &ClaimOutcome, at_most: Duration) {
    match outcome {
        ClaimOutcome::InProgress { retry_after } => {
            assert!(
                *retry_after >= Duration::from_secs(1) && *retry_after <= at_most,
                "retry_after {retry_after:?} not in [1s, {at_most:?}]"
            );
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
}

/// New key → Claimed with the request's token; complete → the same key and fingerprint
/// replay the stored response byte for byte, as often as asked.
pub async fn check_claim_complete_replay(backend: Backend) {
    let (_h, store) = setup(backend).await;
    let token = FencingToken::random();
    assert_eq!(
        claim_with(&*store, SCOPE, KEY, fp(1), token).await,
        ClaimOutcome::Claimed {
            token,
            takeover: None,
            steps: Vec::new(),
        },
        "a new key is claimed with the request's own token"
    );
    let stored = response("pay_1");
    assert!(complete(&*store, token, &stored).await);
    for _ in 0..2 {
        let (outcome, _) = claim(&*store, fp(1)).await;
        assert_eq!(outcome, ClaimOutcome::Replay(stored.clone()));
    }
}

/// [`Store::claim`]'s remaining life ([`ClaimAnswer::replay_lives_for`]) comes only with a
/// replay, and never exceeds the record's: at most the TTL, and shrinking as
/// the store's clock moves (the engine's replay cache keeps its copy no longer than it).
pub async fn check_replay_life_bounds_the_record(backend: Backend) {
    let (h, store) = setup(backend).await;
    let with_expiry = |fingerprint: Fingerprint| {
        let store = store.clone();
        async move {
            let ClaimAnswer {
                outcome,
                replay_lives_for,
            } = store
                .claim(&ClaimRequest {
                    scope: SCOPE,
                    key: KEY,
                    fingerprint: &fingerprint,
                    ttl: TTL,
                    lease: LEASE,
                    token: FencingToken::random(),
                })
                .await
                .expect("claim");
            (outcome, replay_lives_for)
        }
    };
    let (outcome, life) = with_expiry(fp(1)).await;
    let ClaimOutcome::Claimed { token, .. } = outcome else {
        panic!("expected a claim, got {outcome:?}");
    };
    assert_eq!(life, None, "a claim reports no remaining life");
    let (outcome, life) = with_expiry(fp(1)).await;
    assert_in_progress(&outcome, LEASE);
    assert_eq!(
        life, None,
        "an in-progress record reports no remaining life"
    );
    assert!(complete(&*store, token, &response("a")).await);
    let (outcome, life) = with_expiry(fp(2)).await;
    assert_eq!(outcome, ClaimOutcome::Mismatch);
    assert_eq!(life, None, "a mismatch reports no remaining life");
    let (outcome, life) = with_expiry(fp(1)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("a")));
    if let Some(life) = life {
        assert!(
            life <= TTL,
            "remaining life {life:?} beyond the TTL {TTL:?}"
        );
    }
    h.advance(TTL / 2).await;
    let (outcome, life) = with_expiry(fp(1)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("a")));
    if let Some(life) = life {
        assert!(
            life <= TTL / 2,
            "remaining life {life:?} beyond what is left of the TTL ({:?})",
            TTL / 2
        );
    }
}

/// Another fingerprint while the original runs → Mismatch, and the original keeps its
/// claim.
pub async fn check_mismatch_while_in_progress(backend: Backend) {
    let (_h, store) = setup(backend).await;
    let token = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    let (outcome, _) = claim(&*store, fp(2)).await;
    assert_eq!(outcome, ClaimOutcome::Mismatch);
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_in_progress(&outcome, LEASE);
    assert!(complete(&*store, token, &response("a")).await);
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("a")));
}

/// Another fingerprint after completion → Mismatch, and the record still replays.
pub async fn check_mismatch_when_completed(backend: Backend) {
    let (_h, store) = setup(backend).await;
    let token = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    assert!(complete(&*store, token, &response("a")).await);
    let (outcome, _) = claim(&*store, fp(2)).await;
    assert_eq!(outcome, ClaimOutcome::Mismatch);
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("a")));
}

/// The same digest made by another fingerprint version is another request.
pub async fn check_mismatch_on_fingerprint_version(backend: Backend) {
    let (h, store) = setup(backend).await;
    let v1 = fp(7);
    let v2 = Fingerprint { version: 2, ..v1 };
    let token = must_claim(&*store, SCOPE, KEY, v1).await;
    let (outcome, _) = claim(&*store, v2).await;
    assert_eq!(outcome, ClaimOutcome::Mismatch, "in progress");
    // Even once the lease ran out: a lease is only taken over by the same fingerprint.
    h.advance(LEASE).await;
    let (outcome, _) = claim(&*store, v2).await;
    assert_eq!(outcome, ClaimOutcome::Mismatch, "lease ran out");
    assert!(complete(&*store, token, &response("a")).await);
    let (outcome, _) = claim(&*store, v2).await;
    assert_eq!(outcome, ClaimOutcome::Mismatch, "completed");
    let (outcome, _) = claim(&*store, v1).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("a")));
}

/// A duplicate of a running request → InProgress with 1s ≤ retry_after ≤ the lease time
/// left, shrinking as time passes, never zero.
pub async fn check_in_progress_retry_after(backend: Backend) {
    let (h, store) = setup(backend).await;
    must_claim(&*store, SCOPE, KEY, fp(1)).await;
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_in_progress(&outcome, LEASE);
    h.advance(LEASE - Duration::from_secs(10)).await;
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_in_progress(&outcome, Duration::from_secs(10));
    h.advance(Duration::from_secs(9)).await;
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_in_progress(&outcome, Duration::from_secs(1));
}

/// A completed record whose TTL ran out is gone: the next request claims anew, even
/// with another fingerprint. Until then it replays.
pub async fn check_ttl_takeover_of_completed(backend: Backend) {
    let (h, store) = setup(backend).await;
    let old = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    assert!(complete(&*store, old, &response("old")).await);
    h.advance(TTL - Duration::from_secs(60)).await;
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_eq!(
        outcome,
        ClaimOutcome::Replay(response("old")),
        "before the TTL"
    );
    h.advance(Duration::from_secs(60)).await;
    let new = must_take_over(&*store, fp(2), Takeover::Expired).await;
    assert_ne!(new, old);
    assert!(
        !complete(&*store, old, &response("stale")).await,
        "the old token owns nothing"
    );
    let (outcome, _) = claim(&*store, fp(2)).await;
    assert_in_progress(&outcome, LEASE);
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_eq!(
        outcome,
        ClaimOutcome::Mismatch,
        "the new record has the new fingerprint"
    );
    assert!(complete(&*store, new, &response("new")).await);
    let (outcome, _) = claim(&*store, fp(2)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("new")));
    // The new record lives a full TTL from its own claim.
    h.advance(TTL - Duration::from_secs(1)).await;
    let (outcome, _) = claim(&*store, fp(2)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("new")));
}

/// An in-progress record whose TTL *and* lease ran out is gone too, whatever its
/// fingerprint, and its owner is fenced off; while its lease is live it is not expired.
pub async fn check_ttl_takeover_of_in_progress(backend: Backend) {
    let (h, store) = setup(backend).await;
    let old = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    // An owner that renewed just before its TTL ran out, then stopped heartbeating
    // (crashed): the record lives a TTL past the renewal, then it is expired, and a
    // request with any fingerprint is new.
    h.advance(TTL - LEASE / 2).await;
    assert!(renew(&*store, old, LEASE).await);
    h.advance(LEASE / 2).await;
    let (outcome, _) = claim(&*store, fp(2)).await;
    assert_eq!(
        outcome,
        ClaimOutcome::Mismatch,
        "past the TTL, but the lease is live"
    );
    h.advance(LEASE).await;
    let (outcome, _) = claim(&*store, fp(2)).await;
    assert_eq!(
        outcome,
        ClaimOutcome::Mismatch,
        "the lease ran out, but the record lives a TTL past its renewal"
    );
    h.advance(TTL - LEASE).await;
    let new = must_take_over(&*store, fp(2), Takeover::Expired).await;
    assert!(!renew(&*store, old, LEASE).await);
    assert!(!complete(&*store, old, &response("stale")).await);
    assert!(!release(&*store, old).await);
    assert!(complete(&*store, new, &response("new")).await);
    let (outcome, _) = claim(&*store, fp(2)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("new")));
}

/// A claim whose lease ran out (owner crashed) is taken over by the same fingerprint,
/// with the new request's token; the lease runs until exactly `lease_expires_at`.
pub async fn check_lease_takeover_same_fingerprint(backend: Backend) {
    let (h, store) = setup(backend).await;
    let first = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    h.advance(LEASE - Duration::from_secs(1)).await;
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_in_progress(&outcome, Duration::from_secs(1));
    h.advance(Duration::from_secs(1)).await;
    let second = FencingToken::random();
    assert_eq!(
        claim_with(&*store, SCOPE, KEY, fp(1), second).await,
        ClaimOutcome::Claimed {
            token: second,
            takeover: Some(Takeover::LeaseLost),
            steps: Vec::new(),
        }
    );
    // The new owner has a fresh lease.
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_in_progress(&outcome, LEASE);
    assert!(complete(&*store, second, &response("second")).await);
    assert!(!complete(&*store, first, &response("first")).await);
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("second")));
}

/// The reason a takeover reports: expiry wins over a lost lease (a same-fingerprint
/// retry of a record past both its TTL and its lease took over an *expired* record);
/// a record that was released or purged is claimed as new, not taken over.
pub async fn check_takeover_reasons(backend: Backend) {
    let (h, store) = setup(backend).await;
    // Past both the TTL and the lease, same fingerprint: expired.
    let old = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    h.advance(TTL).await;
    let new = must_take_over(&*store, fp(1), Takeover::Expired).await;
    assert!(!complete(&*store, old, &response("old")).await);
    // Past the lease only: lease lost.
    h.advance(LEASE).await;
    let newer = must_take_over(&*store, fp(1), Takeover::LeaseLost).await;
    assert!(!release(&*store, new).await);
    // Released: new again.
    assert!(release(&*store, newer).await);
    let token = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    assert!(complete(&*store, token, &response("done")).await);
    // Completed and expired, then purged: new again.
    h.advance(TTL).await;
    assert_eq!(store.purge_expired(10).await.expect("purge"), 1);
    must_claim(&*store, SCOPE, KEY, fp(2)).await;
}

/// A different fingerprint never takes over a live record, even one whose lease ran out:
/// that is key reuse, not a retry.
pub async fn check_lease_takeover_refused_for_other_fingerprint(backend: Backend) {
    let (h, store) = setup(backend).await;
    must_claim(&*store, SCOPE, KEY, fp(1)).await;
    h.advance(LEASE + Duration::from_secs(1)).await;
    let (outcome, _) = claim(&*store, fp(2)).await;
    assert_eq!(outcome, ClaimOutcome::Mismatch);
    // The refused request changed nothing: the original fingerprint still takes over.
    must_take_over(&*store, fp(1), Takeover::LeaseLost).await;
}

/// After a takeover the old owner's complete, release and renew return false and change
/// nothing: no overwrite, no delete, no lease extension.
pub async fn check_stale_token_changes_nothing(backend: Backend) {
    let (h, store) = setup(backend).await;
    let old = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    h.advance(LEASE).await;
    let new = must_take_over(&*store, fp(1), Takeover::LeaseLost).await;

    assert!(!complete(&*store, old, &response("stale")).await);
    assert!(!release(&*store, old).await);
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_in_progress(&outcome, LEASE);

    // A stale renew must not extend the new owner's lease.
    h.advance(LEASE / 2).await;
    assert!(!renew(&*store, old, LEASE * 10).await);
    h.advance(LEASE / 2).await;
    let third = must_take_over(&*store, fp(1), Takeover::LeaseLost).await;
    assert!(!complete(&*store, new, &response("new")).await);
    assert!(complete(&*store, third, &response("third")).await);
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("third")));
}

/// A token that never claimed, or claims under another key or scope, owns nothing.
pub async fn check_unknown_token_changes_nothing(backend: Backend) {
    let (_h, store) = setup(backend).await;
    let stranger = FencingToken::random();
    assert!(
        !complete(&*store, stranger, &response("x")).await,
        "no record"
    );
    assert!(!release(&*store, stranger).await, "no record");
    assert!(!renew(&*store, stranger, LEASE).await, "no record");
    assert_eq!(store.purge_expired(100).await.expect("purge"), 0);

    let owner = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    let elsewhere = must_claim(&*store, SCOPE, "other-key", fp(1)).await;
    for token in [stranger, elsewhere] {
        assert!(!complete(&*store, token, &response("x")).await);
        assert!(!release(&*store, token).await);
        assert!(!renew(&*store, token, LEASE).await);
    }
    assert!(
        !store
            .complete("acct_bob", KEY, owner, &response("x"))
            .await
            .expect("complete"),
        "a token acts only under its own scope"
    );
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_in_progress(&outcome, LEASE);
    assert!(complete(&*store, owner, &response("owner")).await);
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("owner")));
}

/// Release deletes the claim: the next request claims the key (even with another
/// fingerprint), and the released token owns nothing any more.
pub async fn check_release_lets_next_request_claim(backend: Backend) {
    let (_h, store) = setup(backend).await;
    let first = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    assert!(release(&*store, first).await);
    assert!(!release(&*store, first).await, "released twice");
    assert!(!complete(&*store, first, &response("late")).await);
    assert!(!renew(&*store, first, LEASE).await);
    let second = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    assert!(release(&*store, second).await);
    let third = must_claim(&*store, SCOPE, KEY, fp(2)).await;
    assert!(complete(&*store, third, &response("third")).await);
    assert!(
        !release(&*store, third).await,
        "a completed record is not released"
    );
    let (outcome, _) = claim(&*store, fp(2)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("third")));
}

/// Renew moves the lease to now + lease: past the original lease the claim is still
/// held, and it runs out at the renewed time.
pub async fn check_renew_extends_lease(backend: Backend) {
    let (h, store) = setup(backend).await;
    let token = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    h.advance(Duration::from_secs(20)).await;
    assert!(renew(&*store, token, LEASE).await);
    h.advance(Duration::from_secs(20)).await; // 40s: past the original 30s lease
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_in_progress(&outcome, Duration::from_secs(10));
    assert!(
        renew(&*store, token, Duration::from_secs(5)).await,
        "renew may shorten"
    );
    h.advance(Duration::from_secs(5)).await;
    let taker = must_take_over(&*store, fp(1), Takeover::LeaseLost).await;
    assert!(!renew(&*store, token, LEASE).await);
    assert!(complete(&*store, taker, &response("taker")).await);
    assert!(
        !renew(&*store, taker, LEASE).await,
        "a completed record has no lease"
    );
}

/// A heartbeat near the end of the TTL keeps the running claim alive past it: a handler
/// that outlives its TTL is not taken over by a request with another fingerprint, and
/// its record lives a whole TTL past the heartbeat.
pub async fn check_renew_keeps_a_running_claim_past_its_ttl(backend: Backend) {
    let (h, store) = setup(backend).await;
    let token = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    h.advance(TTL - Duration::from_secs(10)).await;
    assert!(renew(&*store, token, LEASE).await);
    h.advance(Duration::from_secs(15)).await; // past the TTL, inside the renewed lease
    let (outcome, _) = claim(&*store, fp(2)).await;
    assert_eq!(
        outcome,
        ClaimOutcome::Mismatch,
        "still running: not expired"
    );
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_in_progress(&outcome, LEASE);
    assert!(complete(&*store, token, &response("slow")).await);
    assert_eq!(
        store.purge_expired(10).await.expect("purge"),
        0,
        "not expired yet"
    );
    h.advance(LEASE).await;
    assert_eq!(
        store.purge_expired(10).await.expect("purge"),
        0,
        "kept a TTL past the renewal, not only for its lease"
    );
    h.advance(TTL - Duration::from_secs(15) - LEASE).await;
    assert_eq!(
        store.purge_expired(10).await.expect("purge"),
        1,
        "expires a TTL after the last renewal"
    );
}

/// An owner whose lease ran out but which nobody took over still owns its claim: a late
/// heartbeat or completion succeeds.
pub async fn check_owner_keeps_expired_lease_until_taken_over(backend: Backend) {
    let (h, store) = setup(backend).await;
    let token = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    h.advance(LEASE * 2).await;
    assert!(renew(&*store, token, LEASE).await);
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_in_progress(&outcome, LEASE);
    h.advance(LEASE * 2).await;
    assert!(complete(&*store, token, &response("late")).await);
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("late")));
}

/// Runs `n` claims of `(SCOPE, key_of(i))` at once, claim `i` through
/// `stores[i % stores.len()]`; returns the outcomes with their tokens.
async fn concurrent_claims(
    stores: &[Arc<dyn Store>],
    n: usize,
    key_of: impl Fn(usize) -> String,
) -> Vec<(ClaimOutcome, FencingToken)> {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let store = Arc::clone(&stores[i % stores.len()]);
            let barrier = Arc::clone(&barrier);
            let key = key_of(i);
            tokio::spawn(async move {
                barrier.wait().await;
                claim_in(&*store, SCOPE, &key, fp(1)).await
            })
        })
        .collect();
    let mut outcomes = Vec::with_capacity(n);
    for task in tasks {
        outcomes.push(task.await.expect("claim task"));
    }
    outcomes
}

fn exactly_one_winner(
    outcomes: &[(ClaimOutcome, FencingToken)],
    takeover: Option<Takeover>,
) -> FencingToken {
    let winners: Vec<_> = outcomes
        .iter()
        .filter_map(|(outcome, token)| match outcome {
            ClaimOutcome::Claimed {
                token: won,
                takeover: reported,
                ..
            } => {
                assert_eq!(won, token, "a winner gets its own token");
                assert_eq!(*reported, takeover, "the winner's takeover");
                Some(*won)
            }
            other => {
                assert_in_progress(other, LEASE);
                None
            }
        })
        .collect();
    assert_eq!(winners.len(), 1, "exactly one claim wins: {outcomes:?}");
    winners[0]
}

/// 64 simultaneous first requests with one key: exactly one wins, the rest are told the
/// request is in progress, and the winner can complete.
pub async fn check_concurrent_claims_one_winner(backend: Backend) {
    let (_h, store) = setup(backend).await;
    let outcomes = concurrent_claims(std::slice::from_ref(&store), 64, |_| KEY.to_owned()).await;
    let winner = exactly_one_winner(&outcomes, None);
    assert!(complete(&*store, winner, &response("won")).await);
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("won")));
}

/// 64 simultaneous retries of a crashed owner's claim (lease ran out): exactly one takes
/// it over.
pub async fn check_concurrent_takeover_one_winner(backend: Backend) {
    let (h, store) = setup(backend).await;
    let crashed = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    h.advance(LEASE).await;
    let outcomes = concurrent_claims(std::slice::from_ref(&store), 64, |_| KEY.to_owned()).await;
    let winner = exactly_one_winner(&outcomes, Some(Takeover::LeaseLost));
    assert_ne!(winner, crashed);
    assert!(!complete(&*store, crashed, &response("crashed")).await);
    assert!(complete(&*store, winner, &response("won")).await);
}

/// 64 simultaneous claims of different keys all win: write contention is waited out,
/// never reported as an error.
pub async fn check_concurrent_distinct_keys_all_claimed(backend: Backend) {
    let (_h, store) = setup(backend).await;
    let outcomes =
        concurrent_claims(std::slice::from_ref(&store), 64, |i| format!("key-{i}")).await;
    for (i, (outcome, token)) in outcomes.iter().enumerate() {
        assert_eq!(
            *outcome,
            ClaimOutcome::Claimed {
                token: *token,
                takeover: None,
                steps: Vec::new(),
            },
            "key-{i}"
        );
    }
}

/// Claims racing with releases of the same key (the record appears and vanishes under
/// the claimers): never an error, never two owners at once, and every owner's release
/// succeeds. Enough rounds that a lock conflict a database resolves by rolling a release
/// back (InnoDB's deadlock detection) turns up, which the store must retry, not report.
pub async fn check_claims_racing_releases_never_share_a_key(backend: Backend) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const CLAIMERS: usize = 16;
    let (_h, store) = setup(backend).await;
    let owners = Arc::new(AtomicUsize::new(0));
    let wins = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(CLAIMERS));
    let tasks: Vec<_> = (0..CLAIMERS)
        .map(|_| {
            let (store, owners, wins, barrier) = (
                Arc::clone(&store),
                Arc::clone(&owners),
                Arc::clone(&wins),
                Arc::clone(&barrier),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                for _ in 0..200 {
                    match claim(&*store, fp(1)).await {
                        (
                            ClaimOutcome::Claimed {
                                token, takeover, ..
                            },
                            _,
                        ) => {
                            assert_eq!(takeover, None, "a released key is claimed as new");
                            assert_eq!(owners.fetch_add(1, Ordering::SeqCst), 0, "two owners");
                            wins.fetch_add(1, Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            owners.fetch_sub(1, Ordering::SeqCst);
                            assert!(release(&*store, token).await, "the owner releases");
                        }
                        (ClaimOutcome::InProgress { .. }, _) => tokio::task::yield_now().await,
                        (other, _) => panic!("unexpected {other:?}"),
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("claim/release task");
    }
    assert!(wins.load(Ordering::SeqCst) > 0);
}

/// Claims racing the owners' fenced writes: 16 claimers × 200 rounds on four keys, each
/// round's winner of a key recording a step, renewing and completing, then forgetting the
/// record, or renewing and releasing it, while the other claimers keep claiming (their
/// claims of all four keys batched together, on a store that batches). Never an error,
/// never two owners of a key, and every fenced write of an owner takes effect. (The
/// same race over several instances is
/// [`check_instances_claims_racing_fenced_writes_never_fail`].)
pub async fn check_claims_racing_fenced_writes_never_fail(backend: Backend) {
    let (_h, store) = setup(backend).await;
    race_claims_against_fenced_writes(&[store]).await;
}

/// The race of [`check_claims_racing_fenced_writes_never_fail`] over `instances`: stores
/// over one backend, as instances of an app share one database, each key's claimers
/// spread over them.
///
/// Several keys, so that their records lie next to one another in the store's index: on
/// MySQL, a claim batch's duplicate-key check of one key (deleted, so claimed anew) stops
/// on the next key's first index entry and locks it, then inserts before it; an owner's
/// `UPDATE` or `DELETE` of that next key waiting for the same entry closes a cycle, and
/// InnoDB rolls the owner's write back (a deadlock) now and then over this many rounds,
/// which the store must send again, not report.
async fn race_claims_against_fenced_writes(instances: &[Arc<dyn Store>]) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const CLAIMERS: usize = 16;
    const KEYS: usize = 4;
    const ROUNDS: usize = 200;
    let owners: Arc<[AtomicUsize; KEYS]> = Arc::new(Default::default());
    let wins = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(CLAIMERS));
    let step = RecordedStep {
        name: "authorise".to_owned(),
        output: Bytes::from_static(br#"{"authorisation":"auth_1"}"#),
        recorded_at: std::time::UNIX_EPOCH + Duration::from_millis(1_764_000_000_000),
    };
    let tasks: Vec<_> = (0..CLAIMERS)
        .map(|claimer| {
            let (owned, key) = (claimer % KEYS, format!("{KEY}-{}", claimer % KEYS));
            let (store, owners, wins, barrier, step) = (
                Arc::clone(&instances[claimer / KEYS % instances.len()]),
                Arc::clone(&owners),
                Arc::clone(&wins),
                Arc::clone(&barrier),
                step.clone(),
            );
            tokio::spawn(async move {
                let stored = response("raced");
                let owners = &owners[owned];
                barrier.wait().await;
                for _ in 0..ROUNDS {
                    let token = match claim_in(&*store, SCOPE, &key, fp(1)).await {
                        (
                            ClaimOutcome::Claimed {
                                token,
                                takeover,
                                steps,
                            },
                            _,
                        ) => {
                            assert_eq!(takeover, None, "a key forgotten or released is new");
                            assert_eq!(steps, Vec::new(), "a new record has no steps");
                            token
                        }
                        (ClaimOutcome::InProgress { .. }, _) => {
                            tokio::task::yield_now().await;
                            continue;
                        }
                        (ClaimOutcome::Replay(replayed), _) => {
                            assert_eq!(replayed, stored, "the owner's response replays");
                            tokio::task::yield_now().await;
                            continue;
                        }
                        (other, _) => panic!("unexpected {other:?}"),
                    };
                    assert_eq!(owners.fetch_add(1, Ordering::SeqCst), 0, "two owners");
                    let renew = async || {
                        let renewed = store.renew(SCOPE, &key, token, LEASE, TTL).await;
                        assert!(renewed.expect("renew"), "the owner renews");
                    };
                    if wins.fetch_add(1, Ordering::SeqCst) % 2 == 0 {
                        let recorded = store.record_step(SCOPE, &key, token, &step).await;
                        assert!(recorded.expect("record_step"), "the owner records");
                        renew().await;
                        let completed = store.complete(SCOPE, &key, token, &stored).await;
                        assert!(completed.expect("complete"), "the owner completes");
                        owners.fetch_sub(1, Ordering::SeqCst);
                        let forgotten = store.forget(SCOPE, &key, false).await;
                        assert!(
                            matches!(forgotten.expect("forget"), ForgetOutcome::Forgotten(_)),
                            "the completed record is forgotten"
                        );
                    } else {
                        renew().await;
                        owners.fetch_sub(1, Ordering::SeqCst);
                        let released = store.release(SCOPE, &key, token).await;
                        assert!(released.expect("release"), "the owner releases");
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("claim/write task");
    }
    assert!(wins.load(Ordering::SeqCst) > KEYS, "keys were won again");
}

/// The same key in two scopes is two records: both claim (with different fingerprints),
/// each replays its own response, and one scope's token cannot touch the other's.
pub async fn check_scope_isolation(backend: Backend) {
    let (_h, store) = setup(backend).await;
    let alice = must_claim(&*store, "acct_alice", KEY, fp(1)).await;
    let bob = must_claim(&*store, "acct_bob", KEY, fp(2)).await;
    assert!(
        !store
            .release("acct_bob", KEY, alice)
            .await
            .expect("release")
    );
    assert!(
        store
            .complete("acct_alice", KEY, alice, &response("alice"))
            .await
            .expect("complete")
    );
    let (outcome, _) = claim_in(&*store, "acct_bob", KEY, fp(2)).await;
    assert_in_progress(&outcome, LEASE);
    assert!(
        store
            .complete("acct_bob", KEY, bob, &response("bob"))
            .await
            .expect("complete")
    );
    let (outcome, _) = claim_in(&*store, "acct_alice", KEY, fp(1)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("alice")));
    let (outcome, _) = claim_in(&*store, "acct_bob", KEY, fp(2)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("bob")));
    let (outcome, _) = claim_in(&*store, "acct_carol", KEY, fp(1)).await;
    assert!(matches!(outcome, ClaimOutcome::Claimed { .. }));
    // No ambiguity where scope and key meet.
    must_claim(&*store, "a:b", "c", fp(1)).await;
    must_claim(&*store, "a", "b:c", fp(2)).await;
    must_claim(&*store, "a:", "bc", fp(3)).await;
}

/// Keys and scopes compare byte for byte: case, trailing spaces and prefixes matter.
pub async fn check_keys_compared_exactly(backend: Backend) {
    let (_h, store) = setup(backend).await;
    for (i, key) in ["key", "Key", "KEY", "key ", " key", "ke", "key\t"]
        .into_iter()
        .enumerate()
    {
        must_claim(&*store, SCOPE, key, fp(i as u8)).await;
    }
    for (i, scope) in ["acct", "Acct", "acct "].into_iter().enumerate() {
        must_claim(&*store, scope, "key", fp(i as u8)).await;
    }
}

/// The longest key the header allows (255 chars) and a long scope round-trip.
pub async fn check_long_keys_and_scopes(backend: Backend) {
    let (_h, store) = setup(backend).await;
    let key: String = (0..255).map(|i| (b'!' + (i % 94) as u8) as char).collect();
    let scope = format!("tenant/{}", "s".repeat(1000));
    let token = must_claim(&*store, &scope, &key, fp(1)).await;
    assert!(
        store
            .complete(&scope, &key, token, &response("long"))
            .await
            .expect("complete")
    );
    let (outcome, _) = claim_in(&*store, &scope, &key, fp(1)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("long")));
    let shorter = &key[..254];
    must_claim(&*store, &scope, shorter, fp(1)).await;
}

/// Status, headers (raw non-UTF-8 bytes, empty values, repeated names in order) and a
/// 1 MiB body of every byte value come back exactly as stored.
pub async fn check_headers_and_large_body_round_trip(backend: Backend) {
    let (_h, store) = setup(backend).await;
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let body: Vec<u8> = (0..1024 * 1024)
        .map(|i| {
            if i % 4096 < 16 {
                0 // runs of NUL bytes
            } else {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            }
        })
        .collect();
    let stored = StoredResponse {
        status: 202,
        headers: vec![
            (
                "content-type".to_owned(),
                b"application/octet-stream".to_vec(),
            ),
            (
                "x-raw".to_owned(),
                vec![0xff, 0xfe, 0x80, b'a', 0x00, b'\t', 0xc3],
            ),
            ("link".to_owned(), b"</a>; rel=\"first\"".to_vec()),
            ("x-empty".to_owned(), Vec::new()),
            ("link".to_owned(), b"</b>; rel=\"second\"".to_vec()),
            ("etag".to_owned(), b"W/\"\xe2\x82\xac\"".to_vec()),
            ("link".to_owned(), b"</c>; rel=\"third\"".to_vec()),
        ],
        body: Some(Bytes::from(body)),
    };
    let token = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    assert!(complete(&*store, token, &stored).await);
    let (outcome, _) = claim(&*store, fp(1)).await;
    match outcome {
        ClaimOutcome::Replay(replayed) => {
            assert_eq!(replayed.status, stored.status);
            assert_eq!(replayed.headers, stored.headers);
            assert!(
                replayed.body == stored.body,
                "the 1 MiB body differs after the round trip"
            );
        }
        other => panic!("expected Replay, got {other:?}"),
    }
    // Statuses at both ends of the range a handler can return.
    for (i, status) in [100_u16, 299, 451, 599, 999].into_iter().enumerate() {
        let key = format!("status-{i}");
        let token = must_claim(&*store, SCOPE, &key, fp(1)).await;
        let stored = StoredResponse {
            status,
            headers: Vec::new(),
            body: Some(Bytes::from_static(b"x")),
        };
        assert!(
            store
                .complete(SCOPE, &key, token, &stored)
                .await
                .expect("complete")
        );
        let (outcome, _) = claim_in(&*store, SCOPE, &key, fp(1)).await;
        assert_eq!(outcome, ClaimOutcome::Replay(stored));
    }
}

/// A body over the cap (`None`) replays as `None` with its status and headers; an empty
/// body replays as an empty body, not as `None`; no headers replay as no headers.
pub async fn check_body_none_and_empty_round_trip(backend: Backend) {
    let (_h, store) = setup(backend).await;
    let cases = [
        StoredResponse {
            status: 200,
            headers: vec![("content-type".to_owned(), b"application/pdf".to_vec())],
            body: None,
        },
        StoredResponse {
            status: 204,
            headers: Vec::new(),
            body: Some(Bytes::new()),
        },
        StoredResponse {
            status: 200,
            headers: Vec::new(),
            body: None,
        },
    ];
    for (i, stored) in cases.into_iter().enumerate() {
        let key = format!("body-{i}");
        let token = must_claim(&*store, SCOPE, &key, fp(1)).await;
        assert!(
            store
                .complete(SCOPE, &key, token, &stored)
                .await
                .expect("complete")
        );
        let (outcome, _) = claim_in(&*store, SCOPE, &key, fp(1)).await;
        assert_eq!(outcome, ClaimOutcome::Replay(stored), "case {i}");
    }
}

/// purge_expired deletes only records whose TTL ran out (completed or in progress), at
/// most `limit` per call, and returns how many it deleted.
pub async fn check_purge_expired(backend: Backend) {
    const EARLY: Duration = Duration::from_secs(30);
    let (h, store) = setup(backend).await;
    let claim_ttl = |key: String, ttl: Duration| {
        let store = Arc::clone(&store);
        async move {
            let token = FencingToken::random();
            let outcome = store
                .claim(&ClaimRequest {
                    scope: SCOPE,
                    key: &key,
                    fingerprint: &fp(1),
                    ttl,
                    lease: LEASE,
                    token,
                })
                .await
                .expect("claim")
                .outcome;
            assert_eq!(
                outcome,
                ClaimOutcome::Claimed {
                    token,
                    takeover: None,
                    steps: Vec::new(),
                }
            );
            (key, token)
        }
    };
    // Five short-lived records (three completed, two in progress), three long-lived.
    for i in 0..5 {
        let (key, token) = claim_ttl(format!("short-{i}"), TTL).await;
        if i < 3 {
            assert!(
                store
                    .complete(SCOPE, &key, token, &response("s"))
                    .await
                    .expect("complete")
            );
        }
    }
    for i in 0..3 {
        let (key, token) = claim_ttl(format!("long-{i}"), TTL * 2).await;
        if i < 2 {
            assert!(
                store
                    .complete(SCOPE, &key, token, &response("l"))
                    .await
                    .expect("complete")
            );
        }
    }
    assert_eq!(
        store.purge_expired(100).await.expect("purge"),
        0,
        "nothing expired yet"
    );
    // A margin, not one second: stores on a real server clock (Postgres, Redis) see real
    // time pass between these steps too, and a loaded machine can take seconds.
    h.advance(TTL - EARLY).await;
    assert_eq!(
        store.purge_expired(100).await.expect("purge"),
        0,
        "a little early"
    );
    h.advance(EARLY).await;
    assert_eq!(store.purge_expired(0).await.expect("purge"), 0, "limit 0");
    assert_eq!(store.purge_expired(2).await.expect("purge"), 2);
    assert_eq!(store.purge_expired(2).await.expect("purge"), 2);
    assert_eq!(store.purge_expired(100).await.expect("purge"), 1);
    assert_eq!(store.purge_expired(100).await.expect("purge"), 0);
    // The long-lived records survived: another fingerprint is still refused...
    for i in 0..3 {
        let (outcome, _) = claim_in(&*store, SCOPE, &format!("long-{i}"), fp(9)).await;
        assert_eq!(outcome, ClaimOutcome::Mismatch, "long-{i} survived");
    }
    // ...and the purged keys are free.
    for i in 0..5 {
        must_claim(&*store, SCOPE, &format!("short-{i}"), fp(9)).await;
    }
    // The long-lived records and the re-claimed short ones all expire at start + 2 TTL.
    h.advance(TTL - EARLY).await;
    assert_eq!(store.purge_expired(100).await.expect("purge"), 0);
    h.advance(EARLY).await;
    assert_eq!(store.purge_expired(100).await.expect("purge"), 8);
}

/// A purge of more records than one statement of some stores deletes (they slice or
/// chunk a large batch) still deletes exactly `limit`, and the rest on the next call.
pub async fn check_purge_expired_past_one_statement(backend: Backend) {
    const RECORDS: usize = 600;
    let (h, store) = setup(backend).await;
    let records = (0..RECORDS).map(|i| {
        let store = Arc::clone(&store);
        async move {
            let key = format!("bulk-{i}");
            let token = must_claim(&*store, SCOPE, &key, fp(1)).await;
            assert!(
                store
                    .complete(SCOPE, &key, token, &response("bulk"))
                    .await
                    .expect("complete")
            );
        }
    });
    futures_util::future::join_all(records).await;
    h.advance(TTL).await;
    assert_eq!(store.purge_expired(550).await.expect("purge"), 550);
    assert_eq!(store.purge_expired(1000).await.expect("purge"), 50);
    assert_eq!(store.purge_expired(1000).await.expect("purge"), 0);
}

/// After completion the token owns no in-progress claim: completing again returns false
/// and leaves the first response in place; release and renew return false too.
pub async fn check_complete_twice(backend: Backend) {
    let (_h, store) = setup(backend).await;
    let token = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    assert!(complete(&*store, token, &response("first")).await);
    assert!(!complete(&*store, token, &response("second")).await);
    assert!(!complete(&*store, token, &response("first")).await);
    assert!(!release(&*store, token).await);
    assert!(!renew(&*store, token, LEASE).await);
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("first")));
}

/// A duplicate's watch ([`Capabilities::watch`](crate::store::Capabilities::watch), or
/// the engine's poll on a store that offers none), started before the claim ends,
/// resolves once it has ended, whether the end comes before or after the watch is first
/// awaited (a store that subscribes lazily would miss the first), and from another task;
/// the claim after it decides: a replay after `complete`, a new claim after `release`.
/// The bound is generous: a store may resolve on its poll step, a notifying store on
/// its notification.
pub async fn check_watch_wakes_after_complete_and_release(backend: Backend) {
    const BOUND: Duration = Duration::from_secs(60);
    let poll = Duration::from_millis(50);
    let (_h, store) = setup(backend).await;

    // Ended before the watch is first awaited.
    let first = must_claim(&*store, SCOPE, KEY, fp(1)).await;
    let watch = store.capabilities().watch_claim(SCOPE, KEY, poll);
    assert_in_progress(&claim(&*store, fp(1)).await.0, LEASE);
    assert!(complete(&*store, first, &response("first")).await);
    tokio::time::timeout(BOUND, watch)
        .await
        .expect("the watch resolves after the claim completed");
    let (outcome, _) = claim(&*store, fp(1)).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response("first")));

    // Ended by another task while the watch is pending.
    let other = "watch-release";
    let holder = must_claim(&*store, SCOPE, other, fp(2)).await;
    let watch = store.capabilities().watch_claim(SCOPE, other, poll);
    let releasing = {
        let store = store.clone();
        tokio::spawn(async move { store.release(SCOPE, other, holder).await })
    };
    tokio::time::timeout(BOUND, watch)
        .await
        .expect("the watch resolves after the claim was released");
    assert!(releasing.await.expect("release task").expect("release"));
    must_claim(&*store, SCOPE, other, fp(2)).await;
}

/// The store's [`Capabilities`](crate::store::Capabilities) agree with how it behaves:
///
/// - a store that keeps its clock in this process (its harness steps it,
///   [`Harness::step_wall`]) gives that clock, so the engine's replay cache expires its
///   copies on the clock the store expires records by — a decorator that drops its inner
///   store's clock fails here;
/// - an in-process store gives its clock (it keeps time in this process);
/// - a clock it gives is the one its records expire by: [`Harness::advance`] moves it by
///   as much, and a record whose TTL ran out on it is gone.
pub async fn check_capabilities_are_consistent(backend: Backend) {
    let (h, store) = setup(backend).await;
    let offered = store.capabilities();
    if offered.in_process {
        assert!(
            offered.clock.is_some(),
            "the store says it is in-process but gives no clock"
        );
    }
    if h.step_wall(0).await {
        assert!(
            offered.clock.is_some(),
            "the store keeps its clock in this process (its harness steps it) but gives none"
        );
    }
    let Some(clock) = offered.clock else {
        return;
    };
    must_claim(&*store, SCOPE, KEY, fp(1)).await;
    let before = clock.now_millis();
    h.advance(TTL).await;
    let moved = clock.now_millis() - before;
    let ttl_millis = i64::try_from(TTL.as_millis()).expect("the TTL fits");
    assert!(
        moved >= ttl_millis,
        "the store's clock moved {moved} ms while the store's time moved {ttl_millis} ms: \
         its records do not expire by the clock it gives"
    );
    must_take_over(&*store, fp(2), Takeover::Expired).await;
}

#[cfg(test)]
mod tests {
    use std::marker::PhantomData;

    use super::*;
    use crate::clock::ManualClock;
    use crate::store::{Capabilities, Forward, MemoryStore};

    /// How a [`Misstated`] store misstates its memory store's capabilities.
    trait Misstatement: Send + Sync + std::fmt::Debug + 'static {
        fn misstate(offered: Capabilities) -> Capabilities;
    }

    /// Says it is in-process but gives no clock.
    #[derive(Debug)]
    struct InProcessWithoutClock;

    impl Misstatement for InProcessWithoutClock {
        fn misstate(mut offered: Capabilities) -> Capabilities {
            offered.clock = None;
            offered
        }
    }

    /// Drops the clock and the in-process flag: the hand-written decorator that forwards
    /// the operations only.
    #[derive(Debug)]
    struct OperationsOnly;

    impl Misstatement for OperationsOnly {
        fn misstate(_: Capabilities) -> Capabilities {
            Capabilities::none()
        }
    }

    /// Gives a clock its records do not expire by.
    #[derive(Debug)]
    struct AnotherClock;

    impl Misstatement for AnotherClock {
        fn misstate(mut offered: Capabilities) -> Capabilities {
            offered.clock = Some(Arc::new(ManualClock::new()));
            offered
        }
    }

    /// States them as they are.
    #[derive(Debug)]
    struct Truthful;

    impl Misstatement for Truthful {
        fn misstate(offered: Capabilities) -> Capabilities {
            offered
        }
    }

    /// A memory store on a manual clock, behind a decorator that overrides only its
    /// capabilities, as `M` says.
    #[derive(Debug)]
    struct Misstated<M> {
        inner: MemoryStore,
        misstatement: PhantomData<M>,
    }

    impl<M: Misstatement> Forward for Misstated<M> {
        fn inner(&self) -> &dyn Store {
            &self.inner
        }

        fn capabilities(&self) -> Capabilities {
            M::misstate(self.inner.capabilities())
        }
    }

    struct MisstatedHarness<M> {
        store: Arc<Misstated<M>>,
        clock: ManualClock,
    }

    #[async_trait::async_trait]
    impl<M: Misstatement> Harness for MisstatedHarness<M> {
        async fn new() -> Self {
            let clock = ManualClock::new();
            let store = Arc::new(Misstated {
                inner: MemoryStore::with_clock(Arc::new(clock.clone())),
                misstatement: PhantomData,
            });
            Self { store, clock }
        }

        fn store(&self) -> Arc<dyn Store> {
            self.store.clone()
        }

        async fn advance(&self, by: Duration) {
            self.clock.advance(by);
        }

        async fn step_wall(&self, by_millis: i64) -> bool {
            self.clock.step_wall(by_millis);
            true
        }
    }

    fn check<M: Misstatement>() {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a Tokio runtime")
            .block_on(check_capabilities_are_consistent(Backend::of::<
                MisstatedHarness<M>,
            >()));
    }

    #[test]
    #[should_panic(expected = "in-process but gives no clock")]
    fn in_process_without_a_clock_fails() {
        check::<InProcessWithoutClock>();
    }

    #[test]
    #[should_panic(expected = "keeps its clock in this process")]
    fn a_decorator_dropping_the_clock_fails() {
        check::<OperationsOnly>();
    }

    #[test]
    #[should_panic(expected = "do not expire by the clock it gives")]
    fn a_clock_the_records_do_not_expire_by_fails() {
        check::<AnotherClock>();
    }

    #[test]
    fn the_memory_store_behind_a_forwarding_decorator_passes() {
        check::<Truthful>();
    }
}
