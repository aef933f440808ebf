//! The typed entry point ([`Idempotency::once`]) through the public API, on the memory
//! store and on SQLite (a real file): run once, replay the typed output, and every other
//! outcome of the protocol. Each check is written once over a [`Backend`] and run on
//! both by `on_every_store!`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::clock::ManualClock;
use idempotent_runtime::engine::{Disposition, Failure, StoreUnavailable};
use idempotent_runtime::store::{MemoryStore, SqliteStore};
use idempotent_runtime::testing::faults::{Fault, Faulty, Operation};
use idempotent_runtime::{Fingerprint, HandlerConfig, Idempotency, IdempotencyKey, Outcome, Store};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, oneshot};

const CONFIG: HandlerConfig = HandlerConfig::new().name("charge");
const SCOPE: &str = "orders";

/// What the function returns: more than a scalar, so the round trip is a real one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    charge: String,
    cents: u64,
    lines: Vec<(String, u32)>,
}

fn receipt(n: usize) -> Receipt {
    Receipt {
        charge: format!("ch_{n}"),
        cents: 1999,
        lines: vec![("tea".to_owned(), 2), ("cake".to_owned(), 1)],
    }
}

/// A store under test, on a manual clock, and what keeps it alive.
struct Backend {
    store: Arc<dyn Store>,
    clock: ManualClock,
    _dir: Option<tempfile::TempDir>,
}

#[derive(Clone, Copy)]
enum Kind {
    Memory,
    Sqlite,
}

impl Backend {
    async fn new(kind: Kind) -> Self {
        let clock = ManualClock::new();
        match kind {
            Kind::Memory => Self {
                store: Arc::new(MemoryStore::with_clock(Arc::new(clock.clone()))),
                clock,
                _dir: None,
            },
            Kind::Sqlite => {
                let dir = tempfile::tempdir().expect("tempdir");
                let path = dir.path().join("idempotency.db");
                let store = SqliteStore::connect_with_clock(
                    path.to_str().expect("a utf-8 path"),
                    Arc::new(clock.clone()),
                )
                .await
                .expect("open the SQLite store");
                Self {
                    store: Arc::new(store),
                    clock,
                    _dir: Some(dir),
                }
            }
        }
    }

    /// An engine over the store with the default policy.
    fn engine(&self) -> Idempotency {
        Idempotency::builder_shared(self.store.clone()).build()
    }
}

/// One test per check and store: `memory::<check>` and `sqlite::<check>`, each on a
/// multi-thread runtime (the concurrent checks race real threads).
macro_rules! on_every_store {
    ($($check:ident),+ $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $check() {
                    super::$check(super::Backend::new(super::Kind::Memory).await).await
                }
            )+
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $check() {
                    super::$check(super::Backend::new(super::Kind::Sqlite).await).await
                }
            )+
        }
    };
}

on_every_store!(
    ran_then_replayed_with_the_typed_output,
    thirty_two_concurrent_duplicates_run_the_function_once,
    duplicates_of_a_running_call_are_in_progress_with_the_time_left,
    a_key_reused_with_another_payload_runs_nothing,
    a_store_outage_runs_nothing,
    a_record_not_confirmed_is_reported_and_kept_in_progress,
    the_functions_error_releases_and_the_next_call_runs,
    a_panic_releases_and_the_next_call_runs,
    steps_are_resumed_after_a_takeover,
    a_record_that_is_not_an_output_is_unreadable,
    an_output_over_the_cap_is_recorded_without_it,
    an_empty_scope_is_refused,
);

fn payload(amount: u64) -> Fingerprint {
    Fingerprint::of_payload(format!(r#"{{"amount":{amount}}}"#).as_bytes())
}

/// Calls the function for `key` with payload `amount`; it counts its runs and returns
/// the receipt of its run number.
async fn charge(
    engine: &Idempotency,
    config: &HandlerConfig,
    key: &str,
    amount: u64,
    runs: &Arc<AtomicUsize>,
) -> Outcome<Receipt, String> {
    let runs = runs.clone();
    engine
        .once(
            config,
            SCOPE,
            key,
            payload(amount),
            move |_key| async move {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                Ok(receipt(run))
            },
        )
        .await
}

async fn ran_then_replayed_with_the_typed_output(backend: Backend) {
    let engine = backend.engine();
    let runs = Arc::new(AtomicUsize::new(0));
    let first = charge(&engine, &CONFIG, "m1", 100, &runs).await;
    assert!(
        matches!(&first, Outcome::Ran(r) if *r == receipt(1)),
        "{first:?}"
    );
    for _ in 0..3 {
        let again = charge(&engine, &CONFIG, "m1", 100, &runs).await;
        assert!(
            matches!(&again, Outcome::Replayed(r) if *r == receipt(1)),
            "{again:?}"
        );
        assert!(again.is_settled());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Without the replay cache every replay is read back from the store's bytes.
    let uncached = Idempotency::builder_shared(backend.store.clone())
        .replay_cache(None)
        .build();
    assert!(matches!(
        charge(&uncached, &CONFIG, "m2", 100, &runs).await,
        Outcome::Ran(_)
    ));
    let replayed = charge(&uncached, &CONFIG, "m2", 100, &runs).await;
    assert!(
        matches!(&replayed, Outcome::Replayed(r) if *r == receipt(2)),
        "{replayed:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

async fn thirty_two_concurrent_duplicates_run_the_function_once(backend: Backend) {
    let engine = backend.engine();
    let runs = Arc::new(AtomicUsize::new(0));
    // Duplicates wait for the original, so every one of them settles with its output.
    const WAITING: HandlerConfig = CONFIG.wait(Duration::from_secs(30));
    let calls: Vec<_> = (0..32)
        .map(|_| {
            let (engine, runs) = (engine.clone(), runs.clone());
            tokio::spawn(async move { charge(&engine, &WAITING, "m1", 100, &runs).await })
        })
        .collect();
    let (mut ran, mut replayed) = (0, 0);
    for call in calls {
        match call.await.expect("the call") {
            Outcome::Ran(r) => {
                assert_eq!(r, receipt(1));
                ran += 1;
            }
            Outcome::Replayed(r) => {
                assert_eq!(r, receipt(1));
                replayed += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the function ran more than once"
    );
    assert_eq!((ran, replayed), (1, 31));
}

async fn duplicates_of_a_running_call_are_in_progress_with_the_time_left(backend: Backend) {
    let lease = Duration::from_secs(20);
    let engine = Idempotency::builder_shared(backend.store.clone())
        .default_lease(lease)
        .build();
    let (started_tx, started) = oneshot::channel();
    let finish = Arc::new(Notify::new());
    let original = tokio::spawn({
        let (engine, finish) = (engine.clone(), finish.clone());
        async move {
            engine
                .once(&CONFIG, SCOPE, "m1", payload(100), move |_key| async move {
                    let _ = started_tx.send(());
                    finish.notified().await;
                    Ok::<_, String>(receipt(1))
                })
                .await
        }
    });
    started.await.expect("the original started");
    let runs = Arc::new(AtomicUsize::new(0));
    let duplicates: Vec<_> = (0..32)
        .map(|_| {
            let (engine, runs) = (engine.clone(), runs.clone());
            tokio::spawn(async move { charge(&engine, &CONFIG, "m1", 100, &runs).await })
        })
        .collect();
    for duplicate in duplicates {
        match duplicate.await.expect("the duplicate") {
            Outcome::InProgress { retry_after } => assert!(
                retry_after >= Duration::from_secs(1) && retry_after <= lease,
                "{retry_after:?}"
            ),
            other => panic!("expected in progress, got {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "a duplicate ran alongside");
    finish.notify_one();
    assert!(matches!(original.await.unwrap(), Outcome::Ran(_)));
    let after = charge(&engine, &CONFIG, "m1", 100, &runs).await;
    assert!(
        matches!(&after, Outcome::Replayed(r) if *r == receipt(1)),
        "{after:?}"
    );
}

async fn a_key_reused_with_another_payload_runs_nothing(backend: Backend) {
    let engine = backend.engine();
    let runs = Arc::new(AtomicUsize::new(0));
    assert!(matches!(
        charge(&engine, &CONFIG, "m1", 100, &runs).await,
        Outcome::Ran(_)
    ));
    let reused = charge(&engine, &CONFIG, "m1", 999, &runs).await;
    assert!(matches!(reused, Outcome::KeyReused), "{reused:?}");
    assert!(reused.is_settled());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn a_store_outage_runs_nothing(backend: Backend) {
    let faulty = Arc::new(Faulty::new(backend.store.clone()));
    let engine = Idempotency::builder_shared(faulty.clone()).build();
    faulty.inject(Operation::Claim, Fault::Fail);
    let runs = Arc::new(AtomicUsize::new(0));
    let outcome = charge(&engine, &CONFIG, "m1", 100, &runs).await;
    match &outcome {
        Outcome::StoreUnavailable(unavailable) => {
            assert_eq!(unavailable.doing(), "claiming the key");
            let _: &StoreUnavailable = unavailable;
        }
        other => panic!("expected the store unavailable, got {other:?}"),
    }
    assert!(!outcome.is_settled());
    assert_eq!(runs.load(Ordering::SeqCst), 0, "ran without a claim");
    // Healed (the fault was one-shot): the next call runs.
    assert!(matches!(
        charge(&engine, &CONFIG, "m1", 100, &runs).await,
        Outcome::Ran(_)
    ));
}

/// The store refuses completions after the function ran: the caller is told its output
/// is not recorded yet (a consumer must not acknowledge), the claim stays in progress
/// (renewed while the engine keeps trying), and once the store is back the record is
/// written and replayed — the function never runs twice.
async fn a_record_not_confirmed_is_reported_and_kept_in_progress(backend: Backend) {
    let faulty = Arc::new(Faulty::new(backend.store.clone()));
    let engine = Idempotency::builder_shared(faulty.clone()).build();
    faulty.inject_always(Operation::Complete, Fault::Fail);
    let runs = Arc::new(AtomicUsize::new(0));
    let first = charge(&engine, &CONFIG, "m1", 100, &runs).await;
    assert!(
        matches!(&first, Outcome::RanUnrecorded(r) if *r == receipt(1)),
        "{first:?}"
    );
    assert_eq!(first.disposition(), Disposition::Redeliver(None));
    let during = charge(&engine, &CONFIG, "m1", 100, &runs).await;
    assert!(matches!(during, Outcome::InProgress { .. }), "{during:?}");
    faulty.heal();
    assert!(
        engine.drain(Duration::from_secs(60)).await,
        "the background recording did not finish"
    );
    let after = charge(&engine, &CONFIG, "m1", 100, &runs).await;
    assert!(
        matches!(&after, Outcome::Replayed(r) if *r == receipt(1)),
        "{after:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the function ran twice");
}

async fn the_functions_error_releases_and_the_next_call_runs(backend: Backend) {
    let engine = backend.engine();
    let runs = Arc::new(AtomicUsize::new(0));
    let failing = {
        let runs = runs.clone();
        engine
            .once(&CONFIG, SCOPE, "m1", payload(100), move |_key| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Err::<Receipt, _>("gateway timed out".to_owned())
            })
            .await
    };
    match failing {
        Outcome::Failed(Failure::Error(error)) => assert_eq!(error, "gateway timed out"),
        other => panic!("{other:?}"),
    }
    assert!(
        engine.inspect(SCOPE, "m1").await.unwrap().is_none(),
        "the released claim left a record"
    );
    let retry = charge(&engine, &CONFIG, "m1", 100, &runs).await;
    assert!(
        matches!(&retry, Outcome::Ran(r) if *r == receipt(2)),
        "{retry:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

async fn a_panic_releases_and_the_next_call_runs(backend: Backend) {
    let engine = backend.engine();
    let panicked = engine
        .once(&CONFIG, SCOPE, "m1", payload(100), |_key| async move {
            if SCOPE.len() < 100 {
                panic!("the function's bug");
            }
            Ok::<Receipt, String>(receipt(0))
        })
        .await;
    assert!(
        matches!(panicked, Outcome::Failed(Failure::Panicked)),
        "{panicked:?}"
    );
    let runs = Arc::new(AtomicUsize::new(0));
    assert!(matches!(
        charge(&engine, &CONFIG, "m1", 100, &runs).await,
        Outcome::Ran(_)
    ));
}

/// A consumer that crashed after a step: the next delivery takes the key over once the
/// lease ran out (on the store's clock) and resumes after the recorded step.
async fn steps_are_resumed_after_a_takeover(backend: Backend) {
    let (clock, store) = (backend.clock.clone(), backend.store.clone());
    let lease = Duration::from_secs(30);
    let crashed = Idempotency::builder_shared(store.clone())
        .default_lease(lease)
        .build();
    let retrying = Idempotency::builder_shared(store)
        .default_lease(lease)
        .build();
    let authorised = Arc::new(AtomicUsize::new(0));
    let captured = Arc::new(AtomicUsize::new(0));
    /// Authorises (a step), then captures (a step); `hang` stops after the first, as a
    /// crashed process would.
    async fn pay(
        key: IdempotencyKey,
        authorised: Arc<AtomicUsize>,
        captured: Arc<AtomicUsize>,
        hang: Option<oneshot::Sender<()>>,
    ) -> Result<Receipt, String> {
        let authorisation = key
            .step("authorise", || async {
                let n = authorised.fetch_add(1, Ordering::SeqCst) + 1;
                Ok::<_, String>(format!("auth_{n}"))
            })
            .await
            .map_err(|error| error.to_string())?;
        if let Some(hang) = hang {
            let _ = hang.send(());
            std::future::pending::<()>().await;
        }
        key.step("capture", || async {
            captured.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(())
        })
        .await
        .map_err(|error| error.to_string())?;
        Ok(Receipt {
            charge: authorisation,
            cents: 1999,
            lines: Vec::new(),
        })
    }
    let (hung_tx, hung) = oneshot::channel();
    let _crashed = tokio::spawn({
        let (authorised, captured) = (authorised.clone(), captured.clone());
        async move {
            crashed
                .once(&CONFIG, SCOPE, "m1", payload(100), move |key| {
                    pay(key, authorised, captured, Some(hung_tx))
                })
                .await
        }
    });
    hung.await.expect("the first delivery authorised");
    let early = retrying
        .once(&CONFIG, SCOPE, "m1", payload(100), {
            let (authorised, captured) = (authorised.clone(), captured.clone());
            move |key| pay(key, authorised, captured, None)
        })
        .await;
    assert!(matches!(early, Outcome::InProgress { .. }), "{early:?}");
    // The crashed owner renews nothing from here on (its renewals are lease/3 away on
    // the engine's clock); the store's clock passes its lease.
    clock.advance(lease * 2);
    let resumed = retrying
        .once(&CONFIG, SCOPE, "m1", payload(100), {
            let (authorised, captured) = (authorised.clone(), captured.clone());
            move |key| pay(key, authorised, captured, None)
        })
        .await;
    match resumed {
        Outcome::Ran(receipt) => assert_eq!(receipt.charge, "auth_1", "the recorded step"),
        other => panic!("expected a run after the takeover, got {other:?}"),
    }
    assert_eq!(authorised.load(Ordering::SeqCst), 1, "the step ran again");
    assert_eq!(captured.load(Ordering::SeqCst), 1);
}

/// A record an HTTP handler wrote under the same scope and key holds no output: it is
/// reported, not run again and not mistaken for one.
async fn a_record_that_is_not_an_output_is_unreadable(backend: Backend) {
    use axum::response::IntoResponse;
    let engine = backend.engine();
    let response = engine
        .run(&CONFIG, SCOPE, "m1", payload(100), |_key| async {
            (http::StatusCode::CREATED, "created").into_response()
        })
        .await;
    assert_eq!(response.status(), http::StatusCode::CREATED);
    let runs = Arc::new(AtomicUsize::new(0));
    let outcome = charge(&engine, &CONFIG, "m1", 100, &runs).await;
    assert!(
        matches!(
            outcome,
            Outcome::Unreadable(idempotent_runtime::engine::Unreadable::NotAnOutput(201))
        ),
        "{outcome:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // An output of another type than the one recorded.
    assert!(matches!(
        charge(&engine, &CONFIG, "m2", 100, &runs).await,
        Outcome::Ran(_)
    ));
    let other_type = engine
        .once(&CONFIG, SCOPE, "m2", payload(100), |_key| async {
            Ok::<u64, String>(7)
        })
        .await;
    assert!(
        matches!(
            other_type,
            Outcome::Unreadable(idempotent_runtime::engine::Unreadable::Undecodable(_))
        ),
        "{other_type:?}"
    );
}

async fn an_output_over_the_cap_is_recorded_without_it(backend: Backend) {
    let engine = Idempotency::builder_shared(backend.store.clone())
        .max_stored_body(16)
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    assert!(matches!(
        charge(&engine, &CONFIG, "m1", 100, &runs).await,
        Outcome::Ran(_)
    ));
    let replayed = charge(&engine, &CONFIG, "m1", 100, &runs).await;
    assert!(
        matches!(
            replayed,
            Outcome::Unreadable(idempotent_runtime::engine::Unreadable::NotKept)
        ),
        "{replayed:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "not run again");
}

async fn an_empty_scope_is_refused(backend: Backend) {
    let engine = backend.engine();
    let outcome = engine
        .once(&CONFIG, " ", "m1", payload(1), |_key| async {
            Ok::<u8, String>(1)
        })
        .await;
    assert!(
        matches!(
            outcome,
            Outcome::Refused(idempotent_runtime::engine::Refused::ScopeEmpty)
        ),
        "{outcome:?}"
    );
}
