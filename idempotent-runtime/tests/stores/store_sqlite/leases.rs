//! Leases on a real SQLite file whose write lock another connection holds: the
//! interleavings of issue 32 that SQLite's one writer makes possible, reproduced on the
//! system clock with real locks (each check takes a few seconds).
//!
//! - A transactional handler holding `BEGIN IMMEDIATE` starves the other requests'
//!   renewals; a retry of a live handler must still get `409`.
//! - Another connection holding the lock delays the answer of a claim past its lease; the
//!   late claim must not run.
//!
//! And interleaving 3 on SQLite, on a [`ManualClock`]: leases are judged on the host's
//! monotonic clock with its boot id, so a step of the wall clock neither expires a live
//! lease nor keeps one alive, a lease written in another boot has run out, and TTLs stay
//! on the wall clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use idempotent_runtime::clock::{Clock, ManualClock, SystemClock};
use idempotent_runtime::store::SqliteStore;
use idempotent_runtime::store::{
    ClaimOutcome, ClaimRequest, FencingToken, StoredResponse, Takeover,
};
use idempotent_runtime::testing::{Trial, async_trial, ignored_if};
use idempotent_runtime::{Fingerprint, ForgetOutcome, HandlerConfig, Idempotency, Store, Tx};
use sqlx::{Connection, SqliteConnection};
use tempfile::TempDir;

pub(crate) fn trials() -> Vec<Trial> {
    let faketime = ignored_if(
        faketime_missing(),
        vec![async_trial(
            "leases::a_real_wall_step_of_another_process_does_not_expire_a_live_lease",
            a_real_wall_step_of_another_process_does_not_expire_a_live_lease,
        )],
    );
    let mut trials = vec![
        async_trial(
            "leases::a_transaction_holding_the_write_lock_does_not_hand_a_live_key_to_a_retry",
            a_transaction_holding_the_write_lock_does_not_hand_a_live_key_to_a_retry,
        ),
        async_trial(
            "leases::without_a_transaction_a_retry_of_a_live_handler_gets_409",
            without_a_transaction_a_retry_of_a_live_handler_gets_409,
        ),
        async_trial(
            "leases::a_transaction_holds_the_write_lock_no_longer_than_the_store_allows",
            a_transaction_holds_the_write_lock_no_longer_than_the_store_allows,
        ),
        async_trial(
            "leases::a_claim_answered_late_behind_another_connections_lock_does_not_run",
            a_claim_answered_late_behind_another_connections_lock_does_not_run,
        ),
        async_trial(
            "leases::a_forward_wall_step_does_not_expire_a_live_lease",
            a_forward_wall_step_does_not_expire_a_live_lease,
        ),
        async_trial(
            "leases::a_backward_wall_step_does_not_keep_a_lease_alive",
            a_backward_wall_step_does_not_keep_a_lease_alive,
        ),
        async_trial(
            "leases::a_lease_written_in_another_boot_has_run_out",
            a_lease_written_in_another_boot_has_run_out,
        ),
        async_trial(
            "leases::a_lease_written_without_a_boot_is_judged_on_the_wall_clock",
            a_lease_written_without_a_boot_is_judged_on_the_wall_clock,
        ),
        async_trial(
            "leases::a_process_without_a_boot_judges_a_boot_lease_on_the_wall_clock",
            a_process_without_a_boot_judges_a_boot_lease_on_the_wall_clock,
        ),
        async_trial(
            "leases::ttls_stay_on_the_wall_clock",
            ttls_stay_on_the_wall_clock,
        ),
    ];
    trials.extend(faketime);
    trials
}

const SCOPE: &str = "acct_alice";
const FINGERPRINT: Fingerprint = Fingerprint {
    version: 1,
    digest: [7; 32],
};

/// The plain handler's lease: short, so that a transaction holding the lock for two of
/// them is a few seconds.
const SHORT_LEASE: Duration = Duration::from_millis(1500);
const PLAIN: HandlerConfig = HandlerConfig::new().lease(SHORT_LEASE);
/// The transactional handler keeps a long lease: nobody retries it here.
const LEDGER: HandlerConfig = HandlerConfig::new().lease(Duration::from_secs(30));

async fn open(dir: &TempDir) -> (SqliteStore, String) {
    let path = dir.path().join("leases.db");
    let path = path.to_str().expect("utf-8 path").to_owned();
    let store = SqliteStore::connect(&path)
        .await
        .expect("open sqlite store");
    (store, path)
}

fn engine(store: SqliteStore) -> Idempotency {
    Idempotency::builder(store).replay_cache(None).build()
}

/// A plain request on key `p` whose handler counts its run (its side effect, at once)
/// and keeps working for `works`.
async fn plain(engine: &Idempotency, runs: &Arc<AtomicUsize>, works: Duration) -> Response {
    let runs = runs.clone();
    engine
        .run(&PLAIN, SCOPE, "p", FINGERPRINT, move |_key| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(works).await;
            (StatusCode::CREATED, "charged").into_response()
        })
        .await
}

/// Returns once the handler counted its first run (its side effect); bounded.
async fn ran_once(runs: &AtomicUsize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while runs.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the original never ran"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Interleaving 2: a `Tx<Sqlite>` handler holds the write lock for twice the plain
/// handler's lease while that handler is still working; a retry of it must get `409`.
async fn a_transaction_holding_the_write_lock_does_not_hand_a_live_key_to_a_retry() {
    interleaving_two(true).await;
}

/// The control: the same requests without the transaction.
async fn without_a_transaction_a_retry_of_a_live_handler_gets_409() {
    interleaving_two(false).await;
}

async fn interleaving_two(with_transaction: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _path) = open(&dir).await;
    sqlx::query("CREATE TABLE ledger (account TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .expect("create the ledger");
    let engine = engine(store);
    let runs = Arc::new(AtomicUsize::new(0));
    let original = tokio::spawn({
        let (engine, runs) = (engine.clone(), runs.clone());
        async move { plain(&engine, &runs, Duration::from_millis(3600)).await }
    });
    ran_once(&runs).await;
    let ledger = with_transaction.then(|| {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .run_in_transaction::<sqlx::Sqlite, _, _, _>(
                    &LEDGER,
                    SCOPE,
                    "t",
                    FINGERPRINT,
                    async move |_key, tx: &mut Tx<sqlx::Sqlite>| {
                        let written = sqlx::query("INSERT INTO ledger (account) VALUES ('a')")
                            .execute(tx.conn())
                            .await;
                        // Holds SQLite's write lock for two of the plain handler's leases.
                        tokio::time::sleep(SHORT_LEASE * 2).await;
                        let answer: Result<Response, Response> =
                            match written {
                                Ok(_) => Ok(StatusCode::CREATED.into_response()),
                                Err(e) => Err((StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
                                    .into_response()),
                            };
                        answer
                    },
                )
                .await
        })
    });
    // The retry comes once the stored lease could have run out, shortly before the lock
    // frees, so its takeover (if the store lets it) is queued behind the lock.
    tokio::time::sleep(Duration::from_millis(2700)).await;
    let retry = plain(&engine, &runs, Duration::ZERO).await;
    assert_eq!(
        retry.status(),
        StatusCode::CONFLICT,
        "the retry of a live handler (runs: {})",
        runs.load(Ordering::SeqCst)
    );
    let first = original.await.expect("the original request");
    assert_eq!(first.status(), StatusCode::CREATED);
    if let Some(ledger) = ledger {
        assert_eq!(
            ledger.await.expect("the ledger").status(),
            StatusCode::CREATED
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    let replay = plain(&engine, &runs, Duration::ZERO).await;
    assert_eq!(
        replay.status(),
        StatusCode::CREATED,
        "the original's answer"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A transactional handler that would hold the write lock longer than the store's
/// maximum hold is dropped at it: its writes roll back, it answers `500`, and the lock
/// is free for the other requests' renewals.
async fn a_transaction_holds_the_write_lock_no_longer_than_the_store_allows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, path) = open(&dir).await;
    let store = store.with_max_transaction_hold(Duration::from_millis(500));
    sqlx::query("CREATE TABLE ledger (account TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .expect("create the ledger");
    let engine = engine(store);
    let started = std::time::Instant::now();
    let answer = engine
        .run_in_transaction::<sqlx::Sqlite, _, _, _>(
            &LEDGER,
            SCOPE,
            "t",
            FINGERPRINT,
            async move |_key, tx: &mut Tx<sqlx::Sqlite>| {
                let written = sqlx::query("INSERT INTO ledger (account) VALUES ('a')")
                    .execute(tx.conn())
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string());
                tokio::time::sleep(Duration::from_secs(3)).await;
                written.map(|()| StatusCode::CREATED)
            },
        )
        .await;
    assert_eq!(answer.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let mut other = SqliteConnection::connect(&format!("sqlite://{path}"))
        .await
        .expect("another connection");
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ledger")
        .fetch_one(&mut other)
        .await
        .expect("count");
    assert_eq!(rows, 0, "the writes rolled back");
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .expect("the write lock is free");
    sqlx::query("ROLLBACK")
        .execute(&mut other)
        .await
        .expect("rollback");
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "held {:?}",
        started.elapsed()
    );
}

/// Interleaving 1 on a real lock: two stores (two engines) on one file, a third
/// connection holding `BEGIN IMMEDIATE` for 1.5 s. Engine A's claim waits behind it;
/// engine B's retry comes after A's 600 ms lease and waits too. Both are answered once
/// the lock frees, past their leases: neither runs (each answers `503` and releases),
/// and the client's next retry runs the handler once.
async fn a_claim_answered_late_behind_another_connections_lock_does_not_run() {
    const LEASE: Duration = Duration::from_millis(600);
    const SHORT: HandlerConfig = HandlerConfig::new().lease(LEASE);
    let dir = tempfile::tempdir().expect("tempdir");
    let (store_a, path) = open(&dir).await;
    let store_b = SqliteStore::connect(&path).await.expect("a second store");
    let (a, b) = (engine(store_a), engine(store_b));
    let runs = Arc::new(AtomicUsize::new(0));
    let request = |engine: &Idempotency| {
        let (engine, runs) = (engine.clone(), runs.clone());
        async move {
            engine
                .run(&SHORT, SCOPE, "late", FINGERPRINT, move |_key| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // Keeps working past the other claim's answer.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    (StatusCode::CREATED, "charged").into_response()
                })
                .await
        }
    };
    let mut holder = SqliteConnection::connect(&format!("sqlite://{path}"))
        .await
        .expect("a third connection");
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut holder)
        .await
        .expect("take the write lock");
    let first = tokio::spawn(request(&a));
    tokio::time::sleep(LEASE + LEASE / 6).await;
    let retry = tokio::spawn(request(&b));
    tokio::time::sleep(Duration::from_millis(1500) - (LEASE + LEASE / 6)).await;
    sqlx::query("COMMIT")
        .execute(&mut holder)
        .await
        .expect("free the write lock");
    let (first, retry) = (first.await.expect("A"), retry.await.expect("B"));
    let ran = runs.load(Ordering::SeqCst);
    assert_eq!(
        ran,
        0,
        "a claim answered past its lease ran: {ran} run(s), A {}, B {}",
        first.status(),
        retry.status()
    );
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry.status(), StatusCode::SERVICE_UNAVAILABLE);
    let again = request(&b).await;
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}

const START: i64 = 1_700_000_000_000;
const LEASE: Duration = Duration::from_secs(30);

/// A store on a fresh file on `clock`.
async fn store_on(dir: &TempDir, clock: &ManualClock) -> SqliteStore {
    let path = dir.path().join("steps.db");
    SqliteStore::connect_with_clock(path.to_str().expect("utf-8 path"), Arc::new(clock.clone()))
        .await
        .expect("open sqlite store")
}

fn claim(token: FencingToken, ttl: Duration) -> ClaimRequest<'static> {
    ClaimRequest {
        scope: SCOPE,
        key: "k",
        fingerprint: &FINGERPRINT,
        ttl,
        lease: LEASE,
        token,
    }
}

/// Claims the key with a fresh token; the outcome.
async fn claim_now(store: &SqliteStore) -> ClaimOutcome {
    store
        .claim(&claim(FencingToken::random(), Duration::from_secs(3600)))
        .await
        .expect("claim")
        .outcome
}

/// A store with the key claimed (lease [`LEASE`]) on a manual clock; the claim's token.
async fn claimed(dir: &TempDir, clock: &ManualClock) -> (SqliteStore, FencingToken) {
    let store = store_on(dir, clock).await;
    let token = FencingToken::random();
    let first = store
        .claim(&claim(token, Duration::from_secs(3600)))
        .await
        .expect("claim")
        .outcome;
    assert!(matches!(first, ClaimOutcome::Claimed { .. }), "{first:?}");
    (store, token)
}

/// A wall step forward larger than the lease (NTP, a VM resumed) leaves the lease as it
/// was: a retry gets `InProgress`, `forget` refuses, the owner still renews.
async fn a_forward_wall_step_does_not_expire_a_live_lease() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::at_millis(START);
    let (store, token) = claimed(&dir, &clock).await;
    clock.step_wall(60_000);
    let retry = claim_now(&store).await;
    assert!(
        matches!(retry, ClaimOutcome::InProgress { .. }),
        "a forward wall step took a live lease over: {retry:?}"
    );
    let forget = store.forget(SCOPE, "k", false).await.expect("forget");
    assert!(
        matches!(forget, ForgetOutcome::Refused { .. }),
        "{forget:?}"
    );
    assert!(
        store
            .renew(SCOPE, "k", token, LEASE, Duration::from_secs(3600))
            .await
            .expect("renew")
    );
    // The lease runs out when a lease has passed on the monotonic clock, not before.
    clock.advance(LEASE - Duration::from_millis(1));
    assert!(matches!(
        claim_now(&store).await,
        ClaimOutcome::InProgress { .. }
    ));
    clock.advance(Duration::from_millis(1));
    assert_taken_over(&claim_now(&store).await, "the lease outlived its end");
}

/// Asserts that a retry's claim took the key over from a lease that ran out.
fn assert_taken_over(retry: &ClaimOutcome, otherwise: &str) {
    assert!(
        matches!(
            retry,
            ClaimOutcome::Claimed {
                takeover: Some(Takeover::LeaseLost),
                ..
            }
        ),
        "{otherwise}: {retry:?}"
    );
}

/// A wall step backward does not stretch a crashed owner's lease: it runs out a lease
/// after it was written.
async fn a_backward_wall_step_does_not_keep_a_lease_alive() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::at_millis(START);
    let (store, _token) = claimed(&dir, &clock).await;
    clock.step_wall(-60_000);
    clock.advance(LEASE);
    let retry = claim_now(&store).await;
    assert_taken_over(&retry, "a backward wall step kept a lease alive");
}

/// A record whose lease was written in another boot of the host: its lease has run out,
/// whatever the new boot's clock reads (it starts again from zero).
async fn a_lease_written_in_another_boot_has_run_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::at_millis(START);
    let (store, _token) = claimed(&dir, &clock).await;
    let inspected = store.inspect(SCOPE, "k").await.expect("inspect");
    assert!(inspected.is_some());
    clock.reboot();
    let retry = claim_now(&store).await;
    assert_taken_over(&retry, "a lease from another boot was still alive");
}

/// A lease stored without a boot (written before migration 0002, or by a clock that has
/// none) is judged on its wall-clock end, as before.
async fn a_lease_written_without_a_boot_is_judged_on_the_wall_clock() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::at_millis(START);
    let (store, _token) = claimed(&dir, &clock).await;
    sqlx::query("UPDATE idempotency_records SET lease_boot_id = NULL, lease_ends_boot_ms = NULL")
        .execute(store.pool())
        .await
        .expect("a lease as version 1 wrote it");
    assert!(matches!(
        claim_now(&store).await,
        ClaimOutcome::InProgress { .. }
    ));
    clock.step_wall(i64::try_from(LEASE.as_millis()).expect("a short lease"));
    assert_taken_over(&claim_now(&store).await, "the lease outlived its end");
}

/// A process whose clock names no boot (it cannot read the host's) shares the file with
/// one that wrote its lease on the boot clock: it judges that lease on the wall clock,
/// never as run out.
async fn a_process_without_a_boot_judges_a_boot_lease_on_the_wall_clock() {
    /// `clock`'s wall time, with no boot.
    #[derive(Debug)]
    struct NoBoot(ManualClock);
    impl Clock for NoBoot {
        fn now_millis(&self) -> i64 {
            self.0.now_millis()
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::at_millis(START);
    let (_owner, _token) = claimed(&dir, &clock).await;
    let path = dir.path().join("steps.db");
    let other = SqliteStore::connect_with_clock(
        path.to_str().expect("utf-8 path"),
        Arc::new(NoBoot(clock.clone())),
    )
    .await
    .expect("a second store on the file");
    let retry = claim_now(&other).await;
    assert!(
        matches!(retry, ClaimOutcome::InProgress { .. }),
        "a process without a boot took a live lease for run out: {retry:?}"
    );
    clock.advance(LEASE);
    assert_taken_over(&claim_now(&other).await, "the lease outlived its end");
}

/// TTLs are calendar time: a completed record whose TTL passed by a wall step is
/// expired, and purged.
async fn ttls_stay_on_the_wall_clock() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::at_millis(START);
    let store = store_on(&dir, &clock).await;
    let token = FencingToken::random();
    let ttl = Duration::from_secs(120);
    assert!(matches!(
        store
            .claim(&claim(token, ttl))
            .await
            .expect("claim")
            .outcome,
        ClaimOutcome::Claimed { .. }
    ));
    let response = StoredResponse {
        status: 201,
        headers: Vec::new(),
        body: Some(bytes::Bytes::from_static(b"done")),
    };
    assert!(
        store
            .complete(SCOPE, "k", token, &response)
            .await
            .expect("complete")
    );
    clock.step_wall(121_000);
    assert_eq!(store.purge_expired(10).await.expect("purge"), 1);
    assert!(store.inspect(SCOPE, "k").await.expect("inspect").is_none());
}

/// The variable that makes the test binary a child process claiming the key once in the
/// SQLite file it names (see [`child_claim`]).
pub(crate) const CHILD_CLAIM: &str = "IDEMPOTENT_TEST_SQLITE_CHILD_CLAIM";

/// Why the real-process clock test cannot run, if it cannot: it needs `faketime`
/// (Debian package `faketime`; `.ci/run` installs it).
fn faketime_missing() -> Option<String> {
    let found = std::process::Command::new("faketime")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    (!found).then(|| "faketime is not installed (apt-get install faketime)".to_owned())
}

/// The child's part: opens the store at `path` on the system clock, claims the key once
/// with [`LEASE`], and prints its wall clock and the outcome (`claimed`, `taken_over`,
/// `in_progress`, or the other outcome's debug form).
pub(crate) fn child_claim(path: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let store = SqliteStore::connect(path).await.expect("open sqlite store");
        let outcome = claim_now(&store).await;
        let said = match outcome {
            ClaimOutcome::Claimed { takeover: None, .. } => "claimed".to_owned(),
            ClaimOutcome::Claimed {
                takeover: Some(_), ..
            } => "taken_over".to_owned(),
            ClaimOutcome::InProgress { .. } => "in_progress".to_owned(),
            other => format!("{other:?}"),
        };
        println!("{} {said}", SystemClock.now_millis());
    });
}

/// Interleaving 3 with a real clock step: this process claims the key (30 s lease) on
/// the system clock; another process on the same file, its wall clock stepped 60 s
/// forward by libfaketime (monotonic and boot time untouched, as after an NTP step),
/// retries: it must find the lease alive.
async fn a_real_wall_step_of_another_process_does_not_expire_a_live_lease() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, path) = open(&dir).await;
    assert!(matches!(
        claim_now(&store).await,
        ClaimOutcome::Claimed { .. }
    ));
    let child = tokio::task::spawn_blocking(move || {
        std::process::Command::new("faketime")
            .args(["-f", "+60s"])
            .arg(std::env::current_exe().expect("the test binary"))
            .env(CHILD_CLAIM, &path)
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .output()
    })
    .await
    .expect("the child's runner")
    .expect("run the child under faketime");
    let said = String::from_utf8_lossy(&child.stdout);
    assert!(
        child.status.success(),
        "the child failed: {said} {}",
        String::from_utf8_lossy(&child.stderr)
    );
    let (wall, outcome) = said.trim().split_once(' ').expect("the child's answer");
    let stepped = wall.parse::<i64>().expect("its wall clock") - SystemClock.now_millis();
    assert!(
        stepped > 55_000,
        "the child's wall clock was not stepped: {stepped} ms"
    );
    assert_eq!(
        outcome, "in_progress",
        "a process whose wall clock stepped 60 s forward"
    );
}
