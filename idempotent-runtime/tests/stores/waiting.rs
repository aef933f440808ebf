//! Waiting instead of `409` (`HandlerConfig::wait`) at the engine level, with real
//! concurrency (multi-thread runtimes, 50 requests at once) on the memory store, SQLite
//! (a real file, one engine and two engines sharing it) and Postgres (one engine, and
//! three engines with pools of their own: instances woken by `LISTEN/NOTIFY`).
//!
//! No test measures time: the original handler is held until the store has answered
//! "in progress" to every duplicate, so each of them really waits; the waits are long
//! enough never to run out, except where running out is the point.
//!
//! Postgres needs `IDEMPOTENT_TEST_POSTGRES_URL` (each test works in a schema of its
//! own, dropped at the end); without it those tests are reported ignored.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http_body_util::BodyExt;
use idempotent_runtime::store::{ClaimAnswer, Forward, MemoryStore};
use idempotent_runtime::store::{ClaimOutcome, ClaimRequest, FencingToken, StoredResponse};
use idempotent_runtime::testing::{Trial, async_trial, ignored_if};
use idempotent_runtime::{
    Fingerprint, HandlerConfig, Idempotency, IdempotencyKey, Store, StoreError,
};
use tokio::sync::Notify;

const DUPLICATES: usize = 50;
/// Long enough never to run out while the original runs (it is held only until every
/// duplicate has been told "in progress").
const WAIT: Duration = Duration::from_secs(120);
const SCOPE: &str = "acct_alice";
const KEY: &str = "order-1";

const FP: Fingerprint = Fingerprint {
    version: 1,
    digest: [7; 32],
};

/// Counts the claims that found the key in progress, so a handler can hold on until
/// every duplicate is waiting.
#[derive(Debug, Default)]
struct Gate {
    in_progress: AtomicUsize,
    changed: Notify,
}

impl Gate {
    fn saw_in_progress(&self) {
        self.in_progress.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Returns once at least `n` claims found the key in progress.
    async fn until(&self, n: usize) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the check, so a claim in between is not missed.
            changed.as_mut().enable();
            if self.in_progress.load(Ordering::SeqCst) >= n {
                return;
            }
            changed.await;
        }
    }
}

/// Forwards every call and capability to `inner` (its watch included) and tells the gate
/// about claims that found the key in progress.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn Store>,
    gate: Arc<Gate>,
}

#[async_trait]
impl Forward for Counting {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }
    async fn claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimAnswer, StoreError> {
        let answer = self.inner.claim(claim).await?;
        if let ClaimOutcome::InProgress { .. } = answer.outcome {
            self.gate.saw_in_progress();
        }
        Ok(answer)
    }
}

/// Engines (instances), one per store, all counting into one gate.
fn engines(stores: Vec<Arc<dyn Store>>, gate: &Arc<Gate>) -> Vec<Idempotency> {
    stores
        .into_iter()
        .map(|inner| {
            let counting = Counting {
                inner,
                gate: gate.clone(),
            };
            Idempotency::new(counting)
        })
        .collect()
}

/// What the requests got.
#[derive(Debug, Default)]
struct Tally {
    /// Answers that were not replays: status and body.
    fresh: Vec<(StatusCode, String)>,
    /// Bodies of replays.
    replays: Vec<String>,
    conflicts: usize,
}

/// How the original (first) run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Original {
    /// `201`, recorded.
    Succeeds,
    /// `503`, which releases the claim.
    Fails,
}

/// `DUPLICATES` requests with one key at once, spread over `engines`; the first run is
/// held until every other request was told "in progress" (at least once).
async fn duplicates(
    engines: &[Idempotency],
    gate: &Arc<Gate>,
    config: HandlerConfig,
    original: Original,
) -> (Tally, usize) {
    let runs = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(tokio::sync::Barrier::new(DUPLICATES));
    let tasks: Vec<_> = (0..DUPLICATES)
        .map(|i| {
            let engine = engines[i % engines.len()].clone();
            let (runs, gate, start) = (runs.clone(), gate.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                let handler = move |_key| async move {
                    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    if run == 1 {
                        gate.until(DUPLICATES - 1).await;
                        if original == Original::Fails {
                            return StatusCode::SERVICE_UNAVAILABLE.into_response();
                        }
                    }
                    (StatusCode::CREATED, format!("run {run}")).into_response()
                };
                let response = engine.run(&config, SCOPE, KEY, FP, handler).await;
                answer(response).await
            })
        })
        .collect();
    let mut tally = Tally::default();
    for task in tasks {
        let (status, replayed, body) = task.await.expect("request task");
        match (status, replayed) {
            (StatusCode::CONFLICT, _) => tally.conflicts += 1,
            (_, true) => tally.replays.push(body),
            (_, false) => tally.fresh.push((status, body)),
        }
    }
    (tally, runs.load(Ordering::SeqCst))
}

/// The handler of requests that must never run (duplicates that wait or are refused).
async fn never(_key: IdempotencyKey) -> StatusCode {
    panic!("a duplicate must not run")
}

async fn answer(response: Response) -> (StatusCode, bool, String) {
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.expect("body").to_bytes();
    let replayed = parts.headers.contains_key("idempotent-replayed");
    (
        parts.status,
        replayed,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

/// 50 duplicates with `wait`: one execution, 49 replays of it, no `409`.
async fn one_run_and_replays(stores: Vec<Arc<dyn Store>>) {
    let gate = Arc::new(Gate::default());
    let engines = engines(stores, &gate);
    let config = HandlerConfig::new().wait(WAIT);
    let (tally, runs) = duplicates(&engines, &gate, config, Original::Succeeds).await;
    assert_eq!(runs, 1, "{tally:?}");
    assert_eq!(tally.conflicts, 0, "{tally:?}");
    assert_eq!(tally.fresh, vec![(StatusCode::CREATED, "run 1".to_owned())]);
    assert_eq!(tally.replays.len(), DUPLICATES - 1);
    assert!(
        tally.replays.iter().all(|body| body == "run 1"),
        "{tally:?}"
    );
}

/// The original answers `503` (its claim released) while 49 wait: one waiter claims and
/// runs, the 48 others replay its answer; no `409`.
async fn a_released_original_lets_one_waiter_run(stores: Vec<Arc<dyn Store>>) {
    let gate = Arc::new(Gate::default());
    let engines = engines(stores, &gate);
    let config = HandlerConfig::new().wait(WAIT);
    let (mut tally, runs) = duplicates(&engines, &gate, config, Original::Fails).await;
    assert_eq!(runs, 2, "the original and one waiter ran: {tally:?}");
    assert_eq!(tally.conflicts, 0, "{tally:?}");
    tally.fresh.sort();
    assert_eq!(
        tally.fresh,
        vec![
            (StatusCode::CREATED, "run 2".to_owned()),
            (StatusCode::SERVICE_UNAVAILABLE, String::new()),
        ]
    );
    assert_eq!(tally.replays.len(), DUPLICATES - 2);
    assert!(
        tally.replays.iter().all(|body| body == "run 2"),
        "{tally:?}"
    );
}

/// A wait that ends while the original still runs: `409` + `Retry-After`, as without
/// waiting; the original's answer is replayed afterwards. A waiter whose client hangs up
/// leaves nothing behind (the handler still ran once).
async fn a_short_wait_ends_in_409(store: Arc<dyn Store>) {
    let gate = Arc::new(Gate::default());
    let engine = engines(vec![store], &gate).remove(0);
    let config = HandlerConfig::new().wait(Duration::from_millis(50));
    let runs = Arc::new(AtomicUsize::new(0));
    let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let original = {
        let (engine, runs) = (engine.clone(), runs.clone());
        let (started, finish) = (started.clone(), finish.clone());
        tokio::spawn(async move {
            let handler = move |_key| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                started.notify_one();
                finish.notified().await;
                (StatusCode::CREATED, "original").into_response()
            };
            answer(engine.run(&config, SCOPE, KEY, FP, handler).await).await
        })
    };
    started.notified().await;
    let (status, headers, body) = {
        let response = engine.run(&config, SCOPE, KEY, FP, never).await;
        let headers = response.headers().clone();
        let (status, _, body) = answer(response).await;
        (status, headers, body)
    };
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.contains("request_in_progress"), "{body}");
    assert!(headers.contains_key("retry-after"));

    // A waiter whose client hangs up: its task is aborted while it waits.
    let patient = HandlerConfig::new().wait(WAIT);
    let waiting_before = gate.in_progress.load(Ordering::SeqCst);
    let hung_up = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.run(&patient, SCOPE, KEY, FP, never).await })
    };
    gate.until(waiting_before + 1).await;
    hung_up.abort();
    assert!(hung_up.await.is_err_and(|err| err.is_cancelled()));

    finish.notify_one();
    let (status, replayed, body) = original.await.expect("original");
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, false, "original")
    );
    let (status, replayed, body) = answer(engine.run(&config, SCOPE, KEY, FP, never).await).await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, true, "original")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A `409` with `Retry-After` straight away: the wait is off (the default), or turned
/// off for the handler with a zero wait while the engine has a default.
async fn no_wait_is_409_at_once() {
    let default_wait = Idempotency::builder(MemoryStore::new())
        .default_wait(WAIT)
        .build();
    let no_default = Idempotency::new(MemoryStore::new());
    for (engine, config) in [
        (default_wait, HandlerConfig::new().wait(Duration::ZERO)),
        (no_default, HandlerConfig::new()),
    ] {
        let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let original = {
            let (engine, started, finish) = (engine.clone(), started.clone(), finish.clone());
            tokio::spawn(async move {
                let handler = move |_key| async move {
                    started.notify_one();
                    finish.notified().await
                };
                engine.run(&config, SCOPE, KEY, FP, handler).await
            })
        };
        started.notified().await;
        let response = engine.run(&config, SCOPE, KEY, FP, never).await;
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert!(response.headers().contains_key("retry-after"));
        finish.notify_one();
        original.await.expect("original");
    }
}

/// The engine's `default_wait` applies to handlers that set none.
async fn the_engine_default_wait_applies() {
    let gate = Arc::new(Gate::default());
    let store: Arc<dyn Store> = Arc::new(Counting {
        inner: Arc::new(MemoryStore::new()),
        gate: gate.clone(),
    });
    let engine = Idempotency::builder_shared(store)
        .default_wait(WAIT)
        .build();
    let (tally, runs) =
        duplicates(&[engine], &gate, HandlerConfig::new(), Original::Succeeds).await;
    assert_eq!(
        (runs, tally.conflicts, tally.replays.len()),
        (1, 0, DUPLICATES - 1)
    );
}

// ---- backends ----------------------------------------------------------------------

fn memory() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new())
}

/// SQLite stores on one real file: `n` of them are `n` "processes" (pools of their own).
async fn sqlite(dir: &tempfile::TempDir, n: usize) -> Vec<Arc<dyn Store>> {
    let path = dir.path().join("waiting.db");
    let mut stores: Vec<Arc<dyn Store>> = Vec::new();
    for _ in 0..n {
        let store = idempotent_runtime::store::SqliteStore::connect(path.to_str().expect("utf-8"))
            .await
            .expect("open SQLite");
        stores.push(Arc::new(store));
    }
    stores
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use idempotent_runtime::store::PostgresStore;
    use sqlx::{AssertSqlSafe, Connection};

    pub(super) const URL_VAR: &str = "IDEMPOTENT_TEST_POSTGRES_URL";

    pub(super) fn unavailable() -> Option<String> {
        match std::env::var(URL_VAR) {
            Ok(url) if !url.is_empty() => None,
            _ => Some(format!("{URL_VAR} is not set")),
        }
    }

    /// A schema of this test's own, dropped (with everything in it) at the end.
    pub(super) struct Schema {
        url: String,
        pub(super) name: String,
    }

    impl Schema {
        pub(super) fn new() -> Self {
            let url = std::env::var(URL_VAR).expect("the Postgres URL");
            let name = format!("idem_test_wait_{:016x}", rand::random::<u64>());
            Self { url, name }
        }

        /// `n` stores on the schema, each with a pool of its own: `n` instances.
        pub(super) async fn stores(&self, n: usize) -> Vec<Arc<dyn Store>> {
            let mut stores: Vec<Arc<dyn Store>> = Vec::new();
            for _ in 0..n {
                let store = PostgresStore::connect_in_schema(&self.url, &self.name)
                    .await
                    .expect("connect to Postgres");
                stores.push(Arc::new(store));
            }
            stores
        }
    }

    impl Drop for Schema {
        fn drop(&mut self) {
            let (url, name) = (self.url.clone(), self.name.clone());
            let dropped = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                runtime.block_on(async {
                    let mut conn = sqlx::PgConnection::connect(&url).await?;
                    sqlx::query(AssertSqlSafe(format!(
                        "DROP SCHEMA IF EXISTS \"{name}\" CASCADE"
                    )))
                    .execute(&mut conn)
                    .await?;
                    conn.close().await
                })
            })
            .join();
            if !matches!(dropped, Ok(Ok(()))) {
                eprintln!("warning: could not drop test schema {}", self.name);
            }
        }
    }

    /// The triggers' payload is the hash `watch_claim` listens for: SHA-256 over scope,
    /// a zero byte and key, first 32 hex digits, on the channel `idempotent_claim_ended`
    /// — for a completion and for a release of a record a waiter's watch marked; not for
    /// a renewal, and not for the end of a record nobody waits for.
    pub(super) async fn notifications_name_the_claim() {
        use sha2::{Digest, Sha256};
        use sqlx::postgres::PgListener;

        let schema = Schema::new();
        let store = schema.stores(1).await.remove(0);
        let mut listener = PgListener::connect(&schema.url).await.expect("listener");
        listener
            .listen("idempotent_claim_ended")
            .await
            .expect("LISTEN");
        let expected = |key: &str| {
            let digest = Sha256::new()
                .chain_update(SCOPE)
                .chain_update([0])
                .chain_update(key)
                .finalize();
            digest[..16]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        let claim = |key: &'static str, token| ClaimRequest {
            scope: SCOPE,
            key,
            fingerprint: &FP,
            ttl: Duration::from_secs(60),
            lease: Duration::from_secs(30),
            token,
        };
        // The channel is database-wide: other tests' claims notify on it too. Only this
        // test's payloads (and the closing sentinel) count.
        const SENTINEL: &str = "sentinel-of-notifications_name_the_claim";
        let ours = [
            expected("notify-complete"),
            expected("notify-release"),
            expected("notify-unwatched"),
        ];
        let mut next_own = async || loop {
            let notification = listener.recv().await.expect("notification");
            let payload = notification.payload();
            if payload == SENTINEL || ours.iter().any(|own| own == payload) {
                return payload.to_owned();
            }
        };
        let mut conn = sqlx::PgConnection::connect(&schema.url)
            .await
            .expect("connect");
        for (key, complete, watched) in [
            // Nobody waits: its end notifies nothing (checked by the sentinel below).
            ("notify-unwatched", true, false),
            ("notify-complete", true, true),
            ("notify-release", false, true),
        ] {
            let token = FencingToken::random();
            let outcome = store
                .claim(&claim(key, token))
                .await
                .expect("claim")
                .outcome;
            assert!(
                matches!(outcome, ClaimOutcome::Claimed { .. }),
                "{outcome:?}"
            );
            // A waiter's watch marks the record; the end is then notified.
            let watch = watched.then(|| {
                let watches = store.capabilities().watch.expect("Postgres offers a watch");
                tokio::spawn(watches.watch_claim(SCOPE, key, Duration::from_secs(60)))
            });
            // Until the watch has marked the record (it runs once polled).
            if watched {
                loop {
                    let marked: bool = sqlx::query_scalar(AssertSqlSafe(format!(
                        "SELECT waited FROM \"{}\".idempotency_records WHERE scope = $1 AND key = $2",
                        schema.name
                    )))
                    .bind(SCOPE)
                    .bind(key)
                    .fetch_one(&mut conn)
                    .await
                    .expect("read the mark");
                    if marked {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
            }
            assert!(
                store
                    .renew(
                        SCOPE,
                        key,
                        token,
                        Duration::from_secs(30),
                        Duration::from_secs(60)
                    )
                    .await
                    .expect("renew")
            );
            let ended = if complete {
                let response = StoredResponse {
                    status: 201,
                    headers: vec![],
                    body: None,
                };
                store.complete(SCOPE, key, token, &response).await
            } else {
                store.release(SCOPE, key, token).await
            };
            assert!(ended.expect("end the claim"));
            if let Some(watch) = watch {
                // The renewal notified nothing: the first notification is the end.
                assert_eq!(next_own().await, expected(key));
                watch.await.expect("the watch ends");
            }
        }
        // Nothing more of ours: notifications arrive in commit order, and the sentinel
        // commits after everything above.
        sqlx::query("SELECT pg_notify('idempotent_claim_ended', $1)")
            .bind(SENTINEL)
            .execute(&mut conn)
            .await
            .expect("NOTIFY the sentinel");
        assert_eq!(next_own().await, SENTINEL);
    }
}

pub(crate) fn trials() -> Vec<Trial> {
    let mut trials: Vec<Trial> = vec![
        async_trial("memory::one_run_and_replays", || {
            one_run_and_replays(vec![memory()])
        }),
        async_trial("memory::a_released_original_lets_one_waiter_run", || {
            a_released_original_lets_one_waiter_run(vec![memory()])
        }),
        async_trial("memory::a_short_wait_ends_in_409", || {
            a_short_wait_ends_in_409(memory())
        }),
        async_trial("memory::no_wait_is_409_at_once", no_wait_is_409_at_once),
        async_trial(
            "memory::the_engine_default_wait_applies",
            the_engine_default_wait_applies,
        ),
    ];
    for engines in [1, 2] {
        trials.push(async_trial(
            format!("sqlite::{engines}_engines::one_run_and_replays"),
            move || async move {
                let dir = tempfile::tempdir().expect("temporary directory");
                one_run_and_replays(sqlite(&dir, engines).await).await;
            },
        ));
        trials.push(async_trial(
            format!("sqlite::{engines}_engines::a_released_original_lets_one_waiter_run"),
            move || async move {
                let dir = tempfile::tempdir().expect("temporary directory");
                a_released_original_lets_one_waiter_run(sqlite(&dir, engines).await).await;
            },
        ));
    }
    trials.push(async_trial("sqlite::a_short_wait_ends_in_409", || async {
        let dir = tempfile::tempdir().expect("temporary directory");
        a_short_wait_ends_in_409(sqlite(&dir, 1).await.remove(0)).await;
    }));
    #[cfg(feature = "postgres")]
    {
        let mut pg = Vec::new();
        for engines in [1, 3] {
            pg.push(async_trial(
                format!("postgres::{engines}_engines::one_run_and_replays"),
                move || async move {
                    let schema = postgres::Schema::new();
                    one_run_and_replays(schema.stores(engines).await).await;
                },
            ));
            pg.push(async_trial(
                format!("postgres::{engines}_engines::a_released_original_lets_one_waiter_run"),
                move || async move {
                    let schema = postgres::Schema::new();
                    a_released_original_lets_one_waiter_run(schema.stores(engines).await).await;
                },
            ));
        }
        pg.push(async_trial(
            "postgres::a_short_wait_ends_in_409",
            || async {
                let schema = postgres::Schema::new();
                a_short_wait_ends_in_409(schema.stores(1).await.remove(0)).await;
            },
        ));
        pg.push(async_trial(
            "postgres::notifications_name_the_claim",
            postgres::notifications_name_the_claim,
        ));
        trials.extend(ignored_if(postgres::unavailable(), pg));
    }
    trials
}
