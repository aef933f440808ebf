//! The engine's metrics, exact: one scripted sequence of requests — fresh, replay,
//! mismatch, a duplicate while running, a 5xx, missing and malformed keys, an optional
//! key left out, the store down, a completion that needs a retry, a lease lost — on each
//! store (memory, SQLite on a real file, Postgres), through the layer and the attribute
//! (plus a transactional handler on the SQL stores), and then every counter and the
//! number of samples in every histogram must be exactly what the script implies.
//!
//! The engine records from tasks on any of its runtime's threads, and the other tests of
//! this binary record too, so one `DebuggingRecorder` is set as the local recorder of
//! every thread of these trials' runtimes (never installed globally), and the trials take
//! turns (the store-operation histogram has no handler label to tell them apart), each
//! reading what was recorded during its script.
//!
//! Postgres needs `IDEMPOTENT_TEST_POSTGRES_URL`; without it that trial is reported
//! ignored.

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use axum::extract::{Extension, FromRef, FromRequestParts};
use axum::routing::post;
use http::request::Parts;
use http::{Request, StatusCode};
use idempotent_runtime::engine::ReplayCacheConfig;
use idempotent_runtime::layer::IdempotencyLayer;
use idempotent_runtime::metrics::{
    HANDLER_DURATION, Outcome, REQUESTS_TOTAL, STORE_OPERATION_DURATION,
};
use idempotent_runtime::store::{Capabilities, ClaimAnswer, Forward, MemoryStore};
use idempotent_runtime::store::{ClaimRequest, FencingToken, StoredResponse};
use idempotent_runtime::testing::{Trial, ignored_if};
use idempotent_runtime::{Idempotency, IdempotencyKey, Scope, Store, StoreError, idempotent};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::sync::Notify;
use tower::ServiceExt;

pub(crate) fn trials() -> Vec<Trial> {
    let postgres_unavailable = match std::env::var("IDEMPOTENT_TEST_POSTGRES_URL") {
        _ if cfg!(not(feature = "postgres")) => Some("built without the postgres feature".into()),
        Ok(url) if !url.is_empty() => None,
        _ => Some("IDEMPOTENT_TEST_POSTGRES_URL is not set".to_owned()),
    };
    let sqlite_unavailable =
        cfg!(not(feature = "sqlite")).then(|| "built without the sqlite feature".to_owned());
    let mut trials = vec![recorded_trial(
        "memory_counts_every_outcome_exactly",
        || async {
            script("memory", Arc::new(MemoryStore::new())).await;
        },
    )];
    trials.extend(ignored_if(
        sqlite_unavailable,
        vec![recorded_trial(
            "sqlite_counts_every_outcome_exactly",
            sqlite,
        )],
    ));
    trials.extend(ignored_if(
        postgres_unavailable,
        vec![recorded_trial(
            "postgres_counts_every_outcome_exactly",
            postgres,
        )],
    ));
    trials
}

/// What the trials' scripts record into.
fn recorder() -> &'static DebuggingRecorder {
    static RECORDER: OnceLock<DebuggingRecorder> = OnceLock::new();
    RECORDER.get_or_init(DebuggingRecorder::new)
}

/// The recorder's snapshotter.
fn snapshotter() -> Snapshotter {
    recorder().snapshotter()
}

/// A test named `name` running `test` on a multi-thread Tokio runtime of its own (as
/// `testing::async_trial` does), every thread of which records into [`recorder`]: a
/// thread's local recorder comes before the global one, so the engine's tasks record here
/// wherever they run, and the tests on other runtimes do not.
fn recorded_trial<F, Fut>(name: &str, test: F) -> Trial
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    Trial::test(name, move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .on_thread_start(|| {
                // Never restored: the thread ends with this trial's runtime.
                std::mem::forget(metrics::set_default_local_recorder(recorder()));
            })
            .build()
            .expect("a Tokio runtime for the test");
        metrics::with_local_recorder(recorder(), || runtime.block_on(test()));
        Ok(())
    })
}

/// One metric: its name and labels (sorted).
type Id = (String, Vec<(String, String)>);

/// What was recorded since the last call, by metric: how much each counter went up, how
/// many samples each histogram got (a snapshot of the `DebuggingRecorder` resets its
/// counters and drains its histograms). Only the metrics that moved.
fn recorded() -> HashMap<Id, u64> {
    snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _unit, _description, value)| {
            let key = key.key();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|label| (label.key().to_owned(), label.value().to_owned()))
                .collect();
            labels.sort();
            let value = match value {
                DebugValue::Counter(n) => n,
                DebugValue::Histogram(samples) => samples.len() as u64,
                DebugValue::Gauge(_) => return None,
            };
            (value > 0).then(|| ((key.name().to_owned(), labels), value))
        })
        .collect()
}

fn id(name: &str, labels: &[(&str, &str)]) -> Id {
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    labels.sort();
    (name.to_owned(), labels)
}

fn requests(handler: &str, outcome: Outcome) -> Id {
    id(
        REQUESTS_TOTAL,
        &[("handler", handler), ("outcome", outcome.as_str())],
    )
}

fn store_op(operation: &str, result: &str) -> Id {
    id(
        STORE_OPERATION_DURATION,
        &[("operation", operation), ("result", result)],
    )
}

fn handler_runs(handler: &str) -> Id {
    id(HANDLER_DURATION, &[("handler", handler)])
}

/// A store that fails on demand, around a real one.
#[derive(Debug)]
struct Flaky {
    inner: Arc<dyn Store>,
    /// Every claim fails.
    down: AtomicBool,
    /// Every renewal fails, and so does every later renewal of a claim that tried to
    /// renew meanwhile (its lease runs out; other claims renew as usual once this is off).
    renewals_down: AtomicBool,
    /// The claims whose renewals fail.
    doomed: Mutex<Vec<FencingToken>>,
    /// How many of the next completions fail.
    failing_completions: AtomicU32,
}

fn outage() -> StoreError {
    StoreError::backend(std::io::Error::other("the test took the store down"))
}

#[async_trait]
impl Forward for Flaky {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimAnswer, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(outage());
        }
        self.inner.claim(claim).await
    }

    async fn renew(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        lease: Duration,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        {
            let mut doomed = self.doomed.lock().unwrap_or_else(|e| e.into_inner());
            if self.renewals_down.load(Ordering::SeqCst) && !doomed.contains(&token) {
                doomed.push(token);
            }
            if doomed.contains(&token) {
                return Err(outage());
            }
        }
        self.inner.renew(scope, key, token, lease, ttl).await
    }

    async fn complete(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        let fail = self
            .failing_completions
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            return Err(outage());
        }
        self.inner.complete(scope, key, token, response).await
    }

    fn capabilities(&self) -> Capabilities {
        // Not in-process, so the replay cache takes completions on every store the
        // script runs on, the memory store included (see `script`).
        let mut offered = self.inner.capabilities();
        offered.in_process = false;
        offered
    }
}

/// Lets the test hold a handler while it runs.
#[derive(Default)]
struct Gate {
    started: Notify,
    proceed: Notify,
}

/// The caller of the attribute's handler: one fixed account.
struct Caller;

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = StatusCode;

    async fn from_request_parts(_: &mut Parts, _: &S) -> Result<Self, StatusCode> {
        Ok(Caller)
    }
}

impl Scope for Caller {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed("acct_metrics")
    }
}

#[derive(Clone)]
struct AttrState {
    engine: Idempotency,
}

impl FromRef<AttrState> for Idempotency {
    fn from_ref(state: &AttrState) -> Self {
        state.engine.clone()
    }
}

#[idempotent(scope = caller)]
async fn attr_pay(caller: Caller, body: String) -> (StatusCode, String) {
    let _ = caller;
    (StatusCode::CREATED, body)
}

/// The name `#[idempotent]` gives `attr_pay`.
const ATTR_NAME: &str = concat!(module_path!(), "::attr_pay");

/// The router under test: three layered routes, named `{store}.pay`, `{store}.optional`
/// and `{store}.lease`, and the attribute's handler at `/{store}/attr`.
fn app(engine: &Idempotency, store: &'static str, gate: Arc<Gate>) -> (Router, [&'static str; 3]) {
    let name = |route: &str| -> &'static str { Box::leak(format!("{store}.{route}").into()) };
    let names = [name("pay"), name("optional"), name("lease")];
    let layer =
        || IdempotencyLayer::new(engine.clone()).scope_with(|_| Some("acct_metrics".into()));
    let pay_gate = gate.clone();
    let pay = post(move |body: String| {
        let gate = pay_gate.clone();
        async move {
            match body.as_str() {
                "block" => {
                    gate.started.notify_one();
                    gate.proceed.notified().await;
                    (StatusCode::CREATED, body)
                }
                "fail" => (StatusCode::INTERNAL_SERVER_ERROR, body),
                _ => (StatusCode::CREATED, body),
            }
        }
    });
    // The first run waits until its lease is lost, then until the test lets it finish;
    // later runs (the takeover) finish at once.
    let runs = Arc::new(AtomicU32::new(0));
    let lease_gate = gate.clone();
    let lease = post(move |Extension(key): Extension<IdempotencyKey>| {
        let (gate, first) = (lease_gate.clone(), runs.fetch_add(1, Ordering::SeqCst) == 0);
        async move {
            if first {
                key.until_lease_lost().await;
                gate.started.notify_one();
                gate.proceed.notified().await;
            }
            StatusCode::CREATED
        }
    });
    let layered = Router::new()
        .route(&format!("/{store}/pay"), pay.layer(layer().name(names[0])))
        .route(
            &format!("/{store}/optional"),
            post(|| async { StatusCode::CREATED }).layer(layer().name(names[1]).key_optional()),
        )
        .route(
            &format!("/{store}/lease"),
            lease.layer(layer().name(names[2]).lease(Duration::from_millis(300))),
        );
    let attributed = Router::new()
        .route(&format!("/{store}/attr"), post(attr_pay))
        .with_state(AttrState {
            engine: engine.clone(),
        });
    (layered.merge(attributed), names)
}

async fn send(app: &Router, path: &str, key: Option<&str>, body: &'static str) -> StatusCode {
    let mut request = Request::post(path);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let request = request.body(Body::from(body)).expect("request");
    app.clone()
        .oneshot(request)
        .await
        .expect("infallible")
        .status()
}

/// The trials take turns: the store-operation histogram is shared by all of them.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs the script on `inner` and checks every metric it moved; `store` names the
/// routes and handlers.
async fn script(store: &'static str, inner: Arc<dyn Store>) {
    let _turn = TURN.lock().await;
    let flaky = Arc::new(Flaky {
        inner,
        down: AtomicBool::new(false),
        renewals_down: AtomicBool::new(false),
        doomed: Mutex::new(Vec::new()),
        failing_completions: AtomicU32::new(0),
    });
    // A lease of an hour: no renewal happens during the script, except on the route
    // that sets a short one. Completions cached, so that the script's replays and
    // mismatches of keys it completed are answered by the cache and count no claim.
    let engine = Idempotency::builder_shared(flaky.clone())
        .default_lease(Duration::from_secs(3600))
        .replay_cache(Some(ReplayCacheConfig::new().remember_completions(true)))
        .build();
    let gate = Arc::new(Gate::default());
    let (app, [pay, optional, lease]) = app(&engine, store, gate.clone());
    let (pay_path, attr_path) = (format!("/{store}/pay"), format!("/{store}/attr"));
    let key = |name: &str| format!("{store}-{name}-{:016x}", rand::random::<u64>());

    recorded();

    // Fresh, replayed, mismatched.
    let k1 = key("k1");
    assert_eq!(
        send(&app, &pay_path, Some(&k1), "a").await,
        StatusCode::CREATED
    );
    assert_eq!(
        send(&app, &pay_path, Some(&k1), "a").await,
        StatusCode::CREATED
    );
    assert_eq!(
        send(&app, &pay_path, Some(&k1), "b").await,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    // A duplicate while the original runs.
    let k2 = key("k2");
    let original = tokio::spawn({
        let (app, path, k2) = (app.clone(), pay_path.clone(), k2.clone());
        async move { send(&app, &path, Some(&k2), "block").await }
    });
    gate.started.notified().await;
    assert_eq!(
        send(&app, &pay_path, Some(&k2), "block").await,
        StatusCode::CONFLICT
    );
    gate.proceed.notify_one();
    assert_eq!(original.await.expect("original"), StatusCode::CREATED);
    // A 5xx: released.
    let k3 = key("k3");
    assert_eq!(
        send(&app, &pay_path, Some(&k3), "fail").await,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    // Missing and malformed keys, through the layer and through the attribute.
    assert_eq!(
        send(&app, &pay_path, None, "a").await,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        send(&app, &pay_path, Some("  "), "a").await,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        send(&app, &attr_path, None, "a").await,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        send(&app, &attr_path, None, "a").await,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        send(&app, &attr_path, Some("\"x"), "a").await,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        send(&app, &attr_path, Some(&key("attr")), "a").await,
        StatusCode::CREATED
    );
    // `key = optional` without a key.
    assert_eq!(
        send(&app, &format!("/{store}/optional"), None, "").await,
        StatusCode::CREATED
    );
    // The store down: 503, the handler not run.
    flaky.down.store(true, Ordering::SeqCst);
    let k4 = key("k4");
    assert_eq!(
        send(&app, &pay_path, Some(&k4), "a").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    flaky.down.store(false, Ordering::SeqCst);
    // The first completion fails; the second records it.
    flaky.failing_completions.store(1, Ordering::SeqCst);
    let k5 = key("k5");
    assert_eq!(
        send(&app, &pay_path, Some(&k5), "a").await,
        StatusCode::CREATED
    );
    assert_eq!(flaky.failing_completions.load(Ordering::SeqCst), 0);
    assert_eq!(
        send(&app, &pay_path, Some(&k5), "a").await,
        StatusCode::CREATED
    );

    let main_script = recorded();
    let expected: HashMap<Id, u64> = [
        (requests(pay, Outcome::Claimed), 4),  // k1, k2, k3, k5
        (requests(pay, Outcome::Replayed), 2), // k1, k5
        (requests(pay, Outcome::Mismatch), 1),
        (requests(pay, Outcome::InProgress), 1),
        (requests(pay, Outcome::Released), 1),
        (requests(pay, Outcome::KeyMissing), 1),
        (requests(pay, Outcome::KeyInvalid), 1),
        (requests(pay, Outcome::StoreError), 1),
        (requests(pay, Outcome::CompletionRetried), 1),
        (requests(&attr_path, Outcome::KeyMissing), 2),
        (requests(&attr_path, Outcome::KeyInvalid), 1),
        (requests(ATTR_NAME, Outcome::Claimed), 1),
        (requests(optional, Outcome::Unprotected), 1),
        // k1, k2 ×2, k3, k5, attr: answered; k4: failed. k1's replay and mismatch and k5's
        // replay come from the engine's replay cache: no claim.
        (store_op("claim", "ok"), 6),
        (store_op("claim", "error"), 1),
        // k1, k2, k5 (the retry), attr; k5's first attempt failed.
        (store_op("complete", "ok"), 4),
        (store_op("complete", "error"), 1),
        (store_op("release", "ok"), 1),
        (handler_runs(pay), 4),
        (handler_runs(ATTR_NAME), 1),
    ]
    .into_iter()
    .collect();
    assert_eq!(sorted(&main_script), sorted(&expected));

    // A lease lost: the original's renewals fail until its lease runs out, a retry takes
    // the key over, and then the original finishes (its completion finds the key taken).
    // The heartbeat and the completion both notice; the request counts once.
    recorded();
    flaky.renewals_down.store(true, Ordering::SeqCst);
    let (lease_path, k6) = (format!("/{store}/lease"), key("k6"));
    let original = tokio::spawn({
        let (app, path, k6) = (app.clone(), lease_path.clone(), k6.clone());
        async move { send(&app, &path, Some(&k6), "").await }
    });
    gate.started.notified().await;
    flaky.renewals_down.store(false, Ordering::SeqCst);
    // The store's lease ends at most a round trip after the engine gave it up: until
    // then the retry is `409`, counted as such.
    let mut conflicts = 0;
    // Bounded far above the 300 ms lease: a key that never frees fails the test, not
    // hangs it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lost lease never let the retry take the key over"
        );
        match send(&app, &lease_path, Some(&k6), "").await {
            StatusCode::CONFLICT => conflicts += 1,
            status => {
                assert_eq!(status, StatusCode::CREATED, "the retry took the key over");
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gate.proceed.notify_one();
    assert_eq!(original.await.expect("original"), StatusCode::CREATED);
    let mut lease_script = recorded();
    // Renewals ran on a timer: how many is not the point, that the failed ones counted is.
    let failed_renewals = lease_script
        .remove(&store_op("renew", "error"))
        .unwrap_or(0);
    assert!(
        failed_renewals >= 1,
        "renewals failed until the lease ran out"
    );
    lease_script.remove(&store_op("renew", "ok"));
    let mut expected: HashMap<Id, u64> = [
        (requests(lease, Outcome::Claimed), 2),
        (requests(lease, Outcome::LeaseLost), 1),
        (store_op("claim", "ok"), 2 + conflicts),
        // The retry's; the original's found the key taken (`Ok(false)`).
        (store_op("complete", "ok"), 2),
        (handler_runs(lease), 2),
    ]
    .into_iter()
    .collect();
    if conflicts > 0 {
        expected.insert(requests(lease, Outcome::InProgress), conflicts);
    }
    assert_eq!(sorted(&lease_script), sorted(&expected));
}

fn sorted(metrics: &HashMap<Id, u64>) -> Vec<(&Id, &u64)> {
    let mut all: Vec<_> = metrics.iter().collect();
    all.sort();
    all
}

/// A transactional handler on `store` (of database `DB`): recorded in its transaction,
/// replayed, and an `Err` that rolls back and releases the key.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
async fn transactional<DB: idempotent_runtime::transaction::TxDatabase>(
    store: &'static str,
    inner: Arc<dyn Store>,
) {
    use idempotent_runtime::{Fingerprint, FingerprintMode, HandlerConfig};

    let _turn = TURN.lock().await;
    let name: &'static str = Box::leak(format!("{store}.transactional").into());
    let config = HandlerConfig::new().name(name);
    let engine = Idempotency::builder_shared(inner)
        .default_lease(Duration::from_secs(3600))
        .replay_cache(Some(ReplayCacheConfig::new().remember_completions(true)))
        .build();
    let run = |key: String, body: &'static str| {
        let engine = engine.clone();
        async move {
            let fingerprint = Fingerprint::compute(
                FingerprintMode::Raw,
                &http::Method::POST,
                "/transactional",
                None,
                body.as_bytes(),
            );
            engine
                .run_in_transaction::<DB, _, _, _>(
                    &config,
                    "acct_metrics",
                    &key,
                    fingerprint,
                    async move |_key, _tx: &mut idempotent_runtime::Tx<DB>| match body {
                        "err" => Err(StatusCode::CONFLICT),
                        _ => Ok(StatusCode::CREATED),
                    },
                )
                .await
                .status()
        }
    };
    recorded();
    let (k1, k2) = (
        format!("{store}-tx1-{:016x}", rand::random::<u64>()),
        format!("{store}-tx2-{:016x}", rand::random::<u64>()),
    );
    assert_eq!(run(k1.clone(), "ok").await, StatusCode::CREATED);
    assert_eq!(run(k1, "ok").await, StatusCode::CREATED);
    assert_eq!(run(k2, "err").await, StatusCode::CONFLICT);
    let expected: HashMap<Id, u64> = [
        (requests(name, Outcome::Claimed), 2),
        (requests(name, Outcome::Replayed), 1),
        (requests(name, Outcome::Released), 1),
        // k1 and k2; k1's replay comes from the engine's replay cache.
        (store_op("claim", "ok"), 2),
        // Inside the handler's transaction.
        (store_op("complete", "ok"), 1),
        (store_op("release", "ok"), 1),
        (handler_runs(name), 2),
    ]
    .into_iter()
    .collect();
    assert_eq!(sorted(&recorded()), sorted(&expected));
}

/// The script on an SQLite file in a temporary directory.
#[cfg(feature = "sqlite")]
async fn sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("idempotency.db").display());
    let store = idempotent_runtime::store::SqliteStore::connect(&url)
        .await
        .expect("open the SQLite store");
    let store: Arc<dyn Store> = Arc::new(store);
    script("sqlite", store.clone()).await;
    transactional::<sqlx::Sqlite>("sqlite", store).await;
}

#[cfg(not(feature = "sqlite"))]
async fn sqlite() {
    unreachable!("ignored without the sqlite feature")
}

/// The script on Postgres, in a schema of its own (`idem_test_…`, like the Postgres store
/// tests, whose sweep drops one a crashed run left behind), dropped afterwards.
#[cfg(feature = "postgres")]
async fn postgres() {
    use idempotent_runtime::store::PostgresStore;

    let url = std::env::var("IDEMPOTENT_TEST_POSTGRES_URL").expect("the URL is set");
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let schema = format!("idem_test_{secs}_{:016x}", rand::random::<u64>());
    let store = PostgresStore::connect_in_schema(&url, &schema)
        .await
        .unwrap_or_else(|e| panic!("IDEMPOTENT_TEST_POSTGRES_URL is set but unreachable: {e}"));
    let pool = store.pool().clone();
    let store: Arc<dyn Store> = Arc::new(store);
    script("postgres", store.clone()).await;
    transactional::<sqlx::Postgres>("postgres", store).await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
    )))
    .execute(&pool)
    .await
    .expect("drop the test schema");
    pool.close().await;
}

#[cfg(not(feature = "postgres"))]
async fn postgres() {
    unreachable!("ignored without the postgres feature")
}
