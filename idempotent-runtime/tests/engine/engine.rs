//! The engine with plain closures as handlers, on the memory store and on stores that
//! fail on purpose.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use http_body_util::BodyExt;
use idempotent_runtime::store::{ClaimAnswer, Forward, MemoryStore};
use idempotent_runtime::store::{ClaimRequest, FencingToken, StoredResponse};
use idempotent_runtime::{
    Fingerprint, ForgetOutcome, HandlerConfig, Idempotency, OnServerError, RecordInfo, RecordState,
    Store, StoreError,
};
use tokio::sync::Notify;

const CONFIG: HandlerConfig = HandlerConfig::new();

fn fingerprint(n: u8) -> Fingerprint {
    Fingerprint {
        version: 1,
        digest: [n; 32],
    }
}

async fn body_of(response: Response) -> (StatusCode, HeaderMap, Vec<u8>) {
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.expect("body").to_bytes().to_vec();
    (parts.status, parts.headers, bytes)
}

fn problem_code(body: &[u8]) -> String {
    let value: serde_json::Value = serde_json::from_slice(body).expect("problem json");
    value["code"].as_str().expect("code").to_owned()
}

/// A handler that counts its runs and answers `201` with a `Location`, a `Date` and an
/// opt-in header.
fn created(
    runs: &Arc<AtomicUsize>,
) -> impl FnOnce(idempotent_runtime::IdempotencyKey) -> std::future::Ready<Response> + Send + 'static
{
    let runs = runs.clone();
    move |_key| {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        let mut response = (StatusCode::CREATED, format!("{{\"run\":{n}}}")).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            header::LOCATION,
            HeaderValue::from_static("/payments/pay_1"),
        );
        headers.insert(
            header::DATE,
            HeaderValue::from_static("Mon, 30 Nov 2026 00:00:00 GMT"),
        );
        headers.insert("x-request-cost", HeaderValue::from_static("3"));
        headers.insert("x-trace-id", HeaderValue::from_static("abc"));
        std::future::ready(response)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_status_headers_and_body_without_rerunning() {
    let engine = Idempotency::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let config = HandlerConfig::new().exclude_headers(&["x-trace-id"]);

    let first = engine
        .run(&config, "alice", "k1", fingerprint(1), created(&runs))
        .await;
    let (status, headers, body) = body_of(first).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(body, b"{\"run\":1}");

    let again = engine
        .run(&config, "alice", "k1", fingerprint(1), created(&runs))
        .await;
    let (status2, headers2, body2) = body_of(again).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(status2, StatusCode::CREATED);
    assert_eq!(body2, body);
    assert_eq!(headers2["idempotent-replayed"], "true");
    assert_eq!(headers2[header::LOCATION], "/payments/pay_1");
    assert_eq!(headers2[header::CONTENT_TYPE], "application/json");
    assert_eq!(
        headers2["x-request-cost"], "3",
        "every end-to-end header is replayed"
    );
    assert!(headers2.get(header::DATE).is_none(), "Date is per request");
    assert!(
        headers2.get("x-trace-id").is_none(),
        "excluded by the handler"
    );
}

/// A handler that compresses its own body: the replay carries `Content-Encoding` with the
/// same bytes, so it decodes to the same document (no hop-by-hop or per-response header
/// comes along).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_response_replays_with_its_encoding() {
    use std::io::{Read, Write};

    let document = br#"{"id":"pay_1","amount":10000,"note":"compressed by the handler"}"#;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(document).unwrap();
    let gzipped = encoder.finish().unwrap();
    let engine = Idempotency::new(MemoryStore::new());
    let handler = |gzipped: Vec<u8>| {
        move |_| async move {
            let mut response = (StatusCode::CREATED, gzipped).into_response();
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
            headers.insert(header::CONNECTION, HeaderValue::from_static("x-hop"));
            headers.insert("x-hop", HeaderValue::from_static("per-connection"));
            response
        }
    };
    let first = engine
        .run(
            &CONFIG,
            "alice",
            "k",
            fingerprint(1),
            handler(gzipped.clone()),
        )
        .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let (status, headers, body) = body_of(
        engine
            .run(&CONFIG, "alice", "k", fingerprint(1), handler(Vec::new()))
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(headers[header::CONTENT_ENCODING], "gzip");
    assert_eq!(headers[header::VARY], "accept-encoding");
    assert!(headers.get(header::CONNECTION).is_none(), "hop-by-hop");
    assert!(
        headers.get("x-hop").is_none(),
        "named by Connection: hop-by-hop"
    );
    assert_eq!(body, gzipped);
    let mut decoded = Vec::new();
    flate2::read::GzDecoder::new(body.as_slice())
        .read_to_end(&mut decoded)
        .unwrap();
    assert_eq!(decoded, document);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_fingerprint_is_422_and_running_original_is_409() {
    let engine = Idempotency::new(MemoryStore::new());
    let gate = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let original = {
        let (engine, gate, started) = (engine.clone(), gate.clone(), started.clone());
        tokio::spawn(async move {
            engine
                .run(&CONFIG, "alice", "k", fingerprint(1), move |_| async move {
                    started.notify_one();
                    gate.notified().await;
                    StatusCode::CREATED
                })
                .await
        })
    };
    started.notified().await;

    let (status, headers, body) = body_of(
        engine
            .run(&CONFIG, "alice", "k", fingerprint(1), |_| async {
                StatusCode::OK
            })
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem_code(&body), "request_in_progress");
    assert_eq!(headers[header::CONTENT_TYPE], "application/problem+json");
    let retry_after: u64 = headers[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry_after), "retry-after {retry_after}");

    let (status, _, body) = body_of(
        engine
            .run(&CONFIG, "alice", "k", fingerprint(2), |_| async {
                StatusCode::OK
            })
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem_code(&body), "idempotency_key_reused");

    gate.notify_one();
    assert_eq!(original.await.unwrap().status(), StatusCode::CREATED);
    let (status, _, body) = body_of(
        engine
            .run(&CONFIG, "alice", "k", fingerprint(2), |_| async {
                StatusCode::OK
            })
            .await,
    )
    .await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "completed, other fingerprint"
    );
    assert_eq!(problem_code(&body), "idempotency_key_reused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_request_future_still_records_the_outcome() {
    let engine = Idempotency::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let request = {
        let (engine, gate, started, runs) =
            (engine.clone(), gate.clone(), started.clone(), runs.clone());
        tokio::spawn(async move {
            engine
                .run(&CONFIG, "alice", "k", fingerprint(1), move |_| async move {
                    started.notify_one();
                    gate.notified().await;
                    runs.fetch_add(1, Ordering::SeqCst);
                    (StatusCode::CREATED, "charged")
                })
                .await
        })
    };
    started.notified().await;
    // The client hangs up: Hyper drops the request future.
    request.abort();
    assert!(request.await.unwrap_err().is_cancelled());
    gate.notify_one();

    // The retry replays once the detached handler recorded its outcome.
    let mut replayed = None;
    for _ in 0..200 {
        let response = engine
            .run(&CONFIG, "alice", "k", fingerprint(1), |_| async {
                (StatusCode::CREATED, "second run")
            })
            .await;
        if response.status() != StatusCode::CONFLICT {
            replayed = Some(body_of(response).await);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, headers, body) = replayed.expect("the original completed");
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body, b"charged");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_answers_500_and_releases_the_claim() {
    let engine = Idempotency::new(MemoryStore::new());
    let (status, headers, body) = body_of(
        engine
            .run(&CONFIG, "alice", "k", fingerprint(1), |_| async {
                if true {
                    panic!("gateway client bug");
                }
                StatusCode::CREATED
            })
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(headers[header::CONTENT_TYPE], "application/problem+json");
    assert_eq!(problem_code(&body), "internal_error");

    let retry = engine
        .run(&CONFIG, "alice", "k", fingerprint(1), |_| async {
            StatusCode::CREATED
        })
        .await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(
        retry.headers().get("idempotent-replayed").is_none(),
        "ran again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_error_releases_by_default_and_is_stored_on_request() {
    let engine = Idempotency::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let unavailable = |runs: &Arc<AtomicUsize>| {
        let runs = runs.clone();
        move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            (StatusCode::SERVICE_UNAVAILABLE, "gateway down")
        }
    };
    for _ in 0..2 {
        let response = engine
            .run(
                &CONFIG,
                "alice",
                "release",
                fingerprint(1),
                unavailable(&runs),
            )
            .await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(response.headers().get("idempotent-replayed").is_none());
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "released: the retry ran again"
    );

    let store_5xx = HandlerConfig::new().on_server_error(OnServerError::Store);
    runs.store(0, Ordering::SeqCst);
    engine
        .run(
            &store_5xx,
            "alice",
            "store",
            fingerprint(1),
            unavailable(&runs),
        )
        .await;
    let replay = engine
        .run(
            &store_5xx,
            "alice",
            "store",
            fingerprint(1),
            unavailable(&runs),
        )
        .await;
    assert_eq!(replay.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_are_stored_and_replayed() {
    let engine = Idempotency::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let declined = |runs: &Arc<AtomicUsize>| {
        let runs = runs.clone();
        move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            (StatusCode::PAYMENT_REQUIRED, "card declined")
        }
    };
    engine
        .run(&CONFIG, "alice", "k", fingerprint(1), declined(&runs))
        .await;
    let (status, headers, body) = body_of(
        engine
            .run(&CONFIG, "alice", "k", fingerprint(1), declined(&runs))
            .await,
    )
    .await;
    assert_eq!(
        (status, body.as_slice()),
        (StatusCode::PAYMENT_REQUIRED, &b"card declined"[..])
    );
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_over_the_cap_is_answered_once_and_never_rerun() {
    let engine = Idempotency::builder(MemoryStore::new())
        .max_stored_body(16)
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    let big = |runs: &Arc<AtomicUsize>| {
        let runs = runs.clone();
        move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let mut response = (StatusCode::CREATED, "x".repeat(17)).into_response();
            let headers = response.headers_mut();
            headers.insert(header::LOCATION, HeaderValue::from_static("/reports/7"));
            headers.insert(header::ETAG, HeaderValue::from_static("\"v7\""));
            headers.insert(
                header::CONTENT_ENCODING,
                HeaderValue::from_static("identity"),
            );
            response
        }
    };
    let (status, _, body) = body_of(
        engine
            .run(&CONFIG, "alice", "k", fingerprint(1), big(&runs))
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body.len(), 17, "the first answer is whole");

    let (status, headers, body) = body_of(
        engine
            .run(&CONFIG, "alice", "k", fingerprint(1), big(&runs))
            .await,
    )
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never re-run");
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the original status is replayed"
    );
    assert_eq!(headers[header::LOCATION], "/reports/7");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(headers[header::CONTENT_TYPE], "application/problem+json");
    assert!(
        headers.get(header::ETAG).is_none() && headers.get(header::CONTENT_ENCODING).is_none(),
        "validators and encodings of the unkept body are dropped"
    );
    assert_eq!(problem_code(&body), "idempotency_response_not_stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_keeps_a_slow_handler_owned() {
    let store = Arc::new(ObservedStore::default());
    let engine = Idempotency::builder_shared(store.clone()).build();
    let config = HandlerConfig::new().lease(Duration::from_millis(300));
    let gate = Arc::new(Notify::new());
    let original = {
        let (engine, gate) = (engine.clone(), gate.clone());
        tokio::spawn(async move {
            engine
                .run(&config, "alice", "k", fingerprint(1), move |_| async move {
                    gate.notified().await;
                    StatusCode::CREATED
                })
                .await
        })
    };
    // Four renewals, a third of the lease apart: more than a whole lease has passed, so
    // without them a duplicate would take over.
    let mut waited = Duration::ZERO;
    while store.renewals.load(Ordering::SeqCst) < 4 {
        assert!(
            waited < Duration::from_secs(10),
            "the heartbeat renews the lease"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += Duration::from_millis(10);
    }
    let duplicate = engine
        .run(&config, "alice", "k", fingerprint(1), |_| async {
            StatusCode::OK
        })
        .await;
    assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    gate.notify_one();
    assert_eq!(original.await.unwrap().status(), StatusCode::CREATED);
}

/// A store whose every call fails, as if the database were unreachable.
#[derive(Debug)]
struct UnreachableStore;

fn unreachable() -> StoreError {
    StoreError::Open {
        location: "test".into(),
        reason: "unreachable".into(),
    }
}

#[async_trait]
impl Store for UnreachableStore {
    async fn claim(&self, _: &ClaimRequest<'_>) -> Result<ClaimAnswer, StoreError> {
        Err(unreachable())
    }
    async fn record_step(
        &self,
        _: &str,
        _: &str,
        _: FencingToken,
        _: &idempotent_runtime::store::RecordedStep,
    ) -> Result<bool, StoreError> {
        Err(unreachable())
    }
    async fn renew(
        &self,
        _: &str,
        _: &str,
        _: FencingToken,
        _: Duration,
        _: Duration,
    ) -> Result<bool, StoreError> {
        Err(unreachable())
    }
    async fn complete(
        &self,
        _: &str,
        _: &str,
        _: FencingToken,
        _: &StoredResponse,
    ) -> Result<bool, StoreError> {
        Err(unreachable())
    }
    async fn release(&self, _: &str, _: &str, _: FencingToken) -> Result<bool, StoreError> {
        Err(unreachable())
    }
    async fn purge_expired(&self, _: u32) -> Result<u64, StoreError> {
        Err(unreachable())
    }
    async fn inspect(&self, _: &str, _: &str) -> Result<Option<RecordInfo>, StoreError> {
        Err(unreachable())
    }
    async fn forget(&self, _: &str, _: &str, _: bool) -> Result<ForgetOutcome, StoreError> {
        Err(unreachable())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_store_is_503_and_the_handler_never_runs() {
    let engine = Idempotency::new(UnreachableStore);
    let runs = Arc::new(AtomicUsize::new(0));
    let (status, headers, body) = body_of(
        engine
            .run(&CONFIG, "alice", "k", fingerprint(1), created(&runs))
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers[header::CONTENT_TYPE], "application/problem+json");
    assert_eq!(problem_code(&body), "idempotency_store_unavailable");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// The memory store, watched: it counts lease renewals, `complete` fails the first
/// `complete_failures` times, and renewals and completions hang while `stalled` is set
/// (a database that stopped answering, then came back).
#[derive(Debug, Default)]
struct ObservedStore {
    inner: MemoryStore,
    complete_failures: AtomicU32,
    renewals: AtomicU32,
    stalled: std::sync::atomic::AtomicBool,
    unstalled: Notify,
}

impl ObservedStore {
    fn set_stalled(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::SeqCst);
        if !stalled {
            self.unstalled.notify_waiters();
        }
    }

    async fn wait_while_stalled(&self) {
        loop {
            // Registered before the check, so an unstall in between is not missed.
            let unstalled = self.unstalled.notified();
            if !self.stalled.load(Ordering::SeqCst) {
                return;
            }
            unstalled.await;
        }
    }
}

#[async_trait]
impl Forward for ObservedStore {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }
    async fn renew(
        &self,
        s: &str,
        k: &str,
        t: FencingToken,
        l: Duration,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        self.wait_while_stalled().await;
        self.inner.renew(s, k, t, l, ttl).await
    }
    async fn complete(
        &self,
        s: &str,
        k: &str,
        t: FencingToken,
        r: &StoredResponse,
    ) -> Result<bool, StoreError> {
        self.wait_while_stalled().await;
        if self
            .complete_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(unreachable());
        }
        self.inner.complete(s, k, t, r).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_is_retried_until_the_store_answers() {
    for failures in [2, 6] {
        // 2: recorded inline before answering; 6: answered first, recorded in the background.
        let engine = Idempotency::new(ObservedStore {
            complete_failures: AtomicU32::new(failures),
            ..ObservedStore::default()
        });
        let runs = Arc::new(AtomicUsize::new(0));
        let first = engine
            .run(&CONFIG, "alice", "k", fingerprint(1), created(&runs))
            .await;
        assert_eq!(first.status(), StatusCode::CREATED);
        let mut replayed = false;
        for _ in 0..100 {
            let retry = engine
                .run(&CONFIG, "alice", "k", fingerprint(1), created(&runs))
                .await;
            if retry.headers().get("idempotent-replayed").is_some() {
                replayed = true;
                break;
            }
            assert_eq!(
                retry.status(),
                StatusCode::CONFLICT,
                "still recording, never re-run"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(replayed, "recorded after {failures} failures");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

// The store runs on a manual clock, so the sweeper's interval and the polling run on
// tokio's paused time.
#[tokio::test(start_paused = true)]
async fn sweeper_purges_expired_records() {
    let clock = idempotent_runtime::clock::ManualClock::new();
    let store = MemoryStore::with_clock(Arc::new(clock.clone()));
    let engine = Idempotency::new(store.clone());
    let store_len = move |_: &Idempotency| store.len();
    let config = HandlerConfig::new().ttl(Duration::from_secs(60));
    let runs = Arc::new(AtomicUsize::new(0));
    for key in ["a", "b", "c"] {
        engine
            .run(&config, "alice", key, fingerprint(1), created(&runs))
            .await;
    }
    clock.advance(Duration::from_secs(61));
    engine
        .run(&config, "alice", "fresh", fingerprint(1), created(&runs))
        .await;
    assert_eq!(
        engine.purge_expired(2).await.unwrap(),
        3,
        "batches until done"
    );
    assert_eq!(store_len(&engine), 1);
    let sweeper = engine.spawn_sweeper(Duration::from_millis(20));
    clock.advance(Duration::from_secs(61));
    let mut purged = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if store_len(&engine) == 0 {
            purged = true;
            break;
        }
    }
    sweeper.abort();
    assert!(purged, "the sweeper purged the last record");
}

/// The memory store, with every `purge_expired` call's limit and (tokio) time recorded.
#[derive(Debug)]
struct RecordedPurges {
    inner: MemoryStore,
    calls: std::sync::Mutex<Vec<(u32, tokio::time::Instant)>>,
}

#[async_trait]
impl Forward for RecordedPurges {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }

    async fn purge_expired(&self, limit: u32) -> Result<u64, StoreError> {
        self.calls
            .lock()
            .unwrap()
            .push((limit, tokio::time::Instant::now()));
        self.inner.purge_expired(limit).await
    }
}

// Paused tokio time: the pauses between batches are measured exactly.
#[tokio::test(start_paused = true)]
async fn the_sweeper_deletes_in_its_configured_batches_and_pauses_between_them() {
    let clock = idempotent_runtime::clock::ManualClock::new();
    let store = Arc::new(RecordedPurges {
        inner: MemoryStore::with_clock(Arc::new(clock.clone())),
        calls: std::sync::Mutex::default(),
    });
    let pause = Duration::from_millis(250);
    let engine = Idempotency::builder_shared(store.clone())
        .sweep_batch(4)
        .sweep_pause(pause)
        .build();
    let config = HandlerConfig::new().ttl(Duration::from_secs(60));
    let runs = Arc::new(AtomicUsize::new(0));
    for n in 0..10 {
        engine
            .run(
                &config,
                "alice",
                &format!("k{n}"),
                fingerprint(1),
                created(&runs),
            )
            .await;
    }
    clock.advance(Duration::from_secs(61));
    let sweeper = engine.spawn_sweeper(Duration::from_secs(3600));
    tokio::time::timeout(Duration::from_secs(60), async {
        while !store.inner.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the sweeper empties the store within a minute of (paused) time");
    sweeper.abort();
    let calls = store.calls.lock().unwrap().clone();
    let limits: Vec<u32> = calls.iter().map(|(limit, _)| *limit).collect();
    assert_eq!(
        limits,
        [4, 4, 4],
        "10 records in batches of 4: 4, 4, then 2"
    );
    for pair in calls.windows(2) {
        assert!(
            pair[1].1 - pair[0].1 >= pause,
            "a pause of {pause:?} after each full batch"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_waits_for_detached_handlers() {
    let engine = Idempotency::new(MemoryStore::new());
    let gate = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let request = {
        let (engine, gate, started) = (engine.clone(), gate.clone(), started.clone());
        tokio::spawn(async move {
            engine
                .run(&CONFIG, "alice", "k", fingerprint(1), move |_| async move {
                    started.notify_one();
                    gate.notified().await;
                    StatusCode::CREATED
                })
                .await
        })
    };
    started.notified().await;
    request.abort(); // the connection is gone; the handler is not
    assert!(
        !engine.drain(Duration::from_millis(100)).await,
        "still running"
    );
    gate.notify_one();
    assert!(engine.drain(Duration::from_secs(5)).await, "finished");
    let replay = engine
        .run(&CONFIG, "alice", "k", fingerprint(1), |_| async {
            StatusCode::OK
        })
        .await;
    assert_eq!(
        replay.headers()["idempotent-replayed"],
        "true",
        "recorded before drain returned"
    );
}

/// A store that never answers, as behind a silent network partition.
#[derive(Debug)]
struct SilentStore;

#[async_trait]
impl Store for SilentStore {
    async fn claim(&self, _: &ClaimRequest<'_>) -> Result<ClaimAnswer, StoreError> {
        std::future::pending().await
    }
    async fn record_step(
        &self,
        _: &str,
        _: &str,
        _: FencingToken,
        _: &idempotent_runtime::store::RecordedStep,
    ) -> Result<bool, StoreError> {
        std::future::pending().await
    }
    async fn renew(
        &self,
        _: &str,
        _: &str,
        _: FencingToken,
        _: Duration,
        _: Duration,
    ) -> Result<bool, StoreError> {
        std::future::pending().await
    }
    async fn complete(
        &self,
        _: &str,
        _: &str,
        _: FencingToken,
        _: &StoredResponse,
    ) -> Result<bool, StoreError> {
        std::future::pending().await
    }
    async fn release(&self, _: &str, _: &str, _: FencingToken) -> Result<bool, StoreError> {
        std::future::pending().await
    }
    async fn purge_expired(&self, _: u32) -> Result<u64, StoreError> {
        std::future::pending().await
    }
    async fn inspect(&self, _: &str, _: &str) -> Result<Option<RecordInfo>, StoreError> {
        std::future::pending().await
    }
    async fn forget(&self, _: &str, _: &str, _: bool) -> Result<ForgetOutcome, StoreError> {
        std::future::pending().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_store_is_503_after_the_store_timeout() {
    let engine = Idempotency::builder(SilentStore)
        .store_timeout(Duration::from_millis(100))
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        engine.run(&CONFIG, "alice", "k", fingerprint(1), created(&runs)),
    )
    .await
    .expect("answered, not hung");
    let (status, _, body) = body_of(answer).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(problem_code(&body), "idempotency_store_unavailable");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert!(
        engine.drain(Duration::from_secs(5)).await,
        "nothing left hanging"
    );
}

/// `Retry-After` of a `409` follows how long the handler usually takes (here ~50 ms, so
/// one second), not the 30 s lease that heartbeats keep renewing; a handler that never
/// completed yet, or another handler, still gets the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_follows_the_handlers_usual_duration() {
    let engine = Idempotency::new(MemoryStore::new());
    let fast = HandlerConfig::new().name("tests::fast");
    let other = HandlerConfig::new().name("tests::other");
    let retry_after_of = |response: Response| -> u64 {
        assert_eq!(response.status(), StatusCode::CONFLICT);
        response.headers()[header::RETRY_AFTER]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    // Holds key `held` of `config` until the gate opens; returns once it runs.
    let hold = |config: HandlerConfig, key: &'static str| {
        let (gate, started) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let engine = engine.clone();
        let (g, s) = (gate.clone(), started.clone());
        let task = tokio::spawn(async move {
            engine
                .run(&config, "alice", key, fingerprint(1), move |_| async move {
                    s.notify_one();
                    g.notified().await;
                    StatusCode::CREATED
                })
                .await
        });
        (task, gate, started)
    };

    // No run completed yet: the lease left.
    let (task, gate, started) = hold(fast, "k0");
    started.notified().await;
    let duplicate = engine
        .run(&fast, "alice", "k0", fingerprint(1), |_| async {
            StatusCode::OK
        })
        .await;
    assert!(retry_after_of(duplicate) >= 29);
    gate.notify_one();
    task.await.unwrap();

    for n in 1..=3 {
        let response = engine
            .run(
                &fast,
                "alice",
                &format!("done-{n}"),
                fingerprint(1),
                |_| async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    StatusCode::CREATED
                },
            )
            .await;
        assert_eq!(response.status(), StatusCode::CREATED);
    }

    let (task, gate, started) = hold(fast, "k1");
    started.notified().await;
    let duplicate = engine
        .run(&fast, "alice", "k1", fingerprint(1), |_| async {
            StatusCode::OK
        })
        .await;
    assert_eq!(retry_after_of(duplicate), 1);
    gate.notify_one();
    task.await.unwrap();

    let (task, gate, started) = hold(other, "k2");
    started.notified().await;
    let duplicate = engine
        .run(&other, "alice", "k2", fingerprint(1), |_| async {
            StatusCode::OK
        })
        .await;
    assert!(
        retry_after_of(duplicate) >= 29,
        "another handler keeps the lease"
    );
    gate.notify_one();
    task.await.unwrap();
}

/// Renewals stall for longer than the lease, then the store recovers and a retry comes
/// at once: the retry may take the key over, so the original must learn that it lost its
/// lease before its side effect — one execution, not two.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_learns_it_lost_its_lease_before_its_side_effect() {
    let store = Arc::new(ObservedStore::default());
    let engine = Idempotency::builder_shared(store.clone()).build();
    let config = HandlerConfig::new().lease(Duration::from_millis(300));
    let side_effects = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(Notify::new());
    // Prepares for two seconds (long past the lease), then charges — unless the lease
    // was lost first.
    let handler = {
        let (side_effects, started) = (side_effects.clone(), started.clone());
        move |key: idempotent_runtime::IdempotencyKey| async move {
            started.notify_one();
            tokio::select! {
                () = key.until_lease_lost() => {}
                () = tokio::time::sleep(Duration::from_secs(2)) => {}
            }
            if key.lease_lost() {
                return StatusCode::SERVICE_UNAVAILABLE;
            }
            side_effects.fetch_add(1, Ordering::SeqCst);
            StatusCode::CREATED
        }
    };
    let original = {
        let (engine, handler) = (engine.clone(), handler.clone());
        tokio::spawn(async move {
            engine
                .run(&config, "alice", "k", fingerprint(1), handler)
                .await
        })
    };
    started.notified().await;
    store.set_stalled(true);
    // No renewal gets through: once a whole lease has passed, the original is told it
    // lost its key and answers. Only then does the store come back.
    let original = tokio::time::timeout(Duration::from_secs(5), original)
        .await
        .expect("the original learns it lost its lease within a few leases")
        .unwrap();
    store.set_stalled(false);

    let retry = engine
        .run(&config, "alice", "k", fingerprint(1), handler)
        .await;
    assert_eq!(
        retry.status(),
        StatusCode::CREATED,
        "the retry took over and ran"
    );
    assert_eq!(
        original.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "the original stopped before its side effect"
    );
    assert_eq!(side_effects.load(Ordering::SeqCst), 1);
}

/// A key the engine did not hand out never reports a lost lease.
#[tokio::test]
async fn a_key_made_by_hand_has_no_lease_to_lose() {
    let key = idempotent_runtime::IdempotencyKey::new("alice".into(), "k".into());
    assert!(!key.lease_lost());
    let waited = tokio::time::timeout(Duration::from_millis(20), key.until_lease_lost()).await;
    assert!(waited.is_err());
}

/// An empty scope (say, optional authentication that found nobody) is refused with
/// `500`: one key space for every anonymous caller would replay one caller's answer to
/// another. The handler never runs and nothing is claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_scope_is_refused_and_nothing_runs() {
    let engine = Idempotency::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    for scope in ["", "  "] {
        let (status, headers, body) = body_of(
            engine
                .run(&CONFIG, scope, "k", fingerprint(1), created(&runs))
                .await,
        )
        .await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(headers[header::CONTENT_TYPE], "application/problem+json");
        assert_eq!(problem_code(&body), "idempotency_scope_empty");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // The key is still free for a real caller.
    let response = engine
        .run(&CONFIG, "alice", "k", fingerprint(1), created(&runs))
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
}

/// A handler whose response body is `chunks`, then an error (if `fail`) or an endless
/// wait (if `hang`); counts its runs.
fn streaming(
    runs: &Arc<AtomicUsize>,
    chunks: &'static [&'static str],
    then: &'static str,
) -> impl FnOnce(idempotent_runtime::IdempotencyKey) -> std::future::Ready<Response> + Send + 'static
{
    let runs = runs.clone();
    move |_key| {
        runs.fetch_add(1, Ordering::SeqCst);
        let items: Vec<Result<bytes::Bytes, std::io::Error>> = chunks
            .iter()
            .map(|c| Ok(bytes::Bytes::from_static(c.as_bytes())))
            .collect();
        let head = futures_util::stream::iter(items);
        let body = match then {
            "fail" => {
                axum::body::Body::from_stream(head.chain(futures_util::stream::once(async {
                    Err(std::io::Error::other("the upstream feed closed"))
                })))
            }
            "hang" => axum::body::Body::from_stream(head.chain(futures_util::stream::pending())),
            _ => axum::body::Body::from_stream(head),
        };
        std::future::ready((StatusCode::OK, body).into_response())
    }
}

use futures_util::StreamExt as _;

/// A streamed body over the cap: the client gets every byte (streamed past the cap, not
/// buffered), the record keeps status and headers, and a retry never runs it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_body_over_the_cap_reaches_the_client_whole() {
    let engine = Idempotency::builder(MemoryStore::new())
        .max_stored_body(4)
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    const CHUNKS: &[&str] = &["abc", "def", "ghi", "jkl"];
    let (status, _, body) = body_of(
        engine
            .run(
                &CONFIG,
                "alice",
                "k",
                fingerprint(1),
                streaming(&runs, CHUNKS, "end"),
            )
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, b"abcdefghijkl");
    let (status, headers, body) = body_of(
        engine
            .run(
                &CONFIG,
                "alice",
                "k",
                fingerprint(1),
                streaming(&runs, CHUNKS, "end"),
            )
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(problem_code(&body), "idempotency_response_not_stored");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A response that never ends (an event stream) cannot hold its claim forever: at the
/// maximum duration the outcome is recorded, while the client keeps receiving the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_response_is_recorded_at_the_maximum_duration() {
    let engine = Idempotency::new(MemoryStore::new());
    let config = HandlerConfig::new().max_duration(Duration::from_millis(200));
    let runs = Arc::new(AtomicUsize::new(0));
    const EVENTS: &[&str] = &["data: 1\n\n"];
    let first = engine
        .run(
            &config,
            "alice",
            "k",
            fingerprint(1),
            streaming(&runs, EVENTS, "hang"),
        )
        .await;
    assert_eq!(first.status(), StatusCode::OK);
    let mut stream = first.into_body().into_data_stream();
    assert_eq!(stream.next().await.unwrap().unwrap(), "data: 1\n\n");

    let retry = engine
        .run(
            &config,
            "alice",
            "k",
            fingerprint(1),
            streaming(&runs, EVENTS, "hang"),
        )
        .await;
    assert_eq!(retry.status(), StatusCode::OK, "recorded, not in progress");
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A body that fails after the handler answered: the side effect happened, so the key is
/// not released for a retry to run it again; the outcome is recorded without the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_fails_after_the_handler_answered_is_recorded_not_released() {
    let engine = Idempotency::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    const CHUNKS: &[&str] = &["{\"id\":"];
    let (status, _, body) = body_of(
        engine
            .run(
                &CONFIG,
                "alice",
                "k",
                fingerprint(1),
                streaming(&runs, CHUNKS, "fail"),
            )
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "the status the handler answered");
    assert_eq!(problem_code(&body), "idempotency_response_not_stored");
    let (status, headers, body) = body_of(
        engine
            .run(
                &CONFIG,
                "alice",
                "k",
                fingerprint(1),
                streaming(&runs, CHUNKS, "fail"),
            )
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(problem_code(&body), "idempotency_response_not_stored");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never run twice");
}

/// A handler still running at its maximum duration is interrupted and recorded as such:
/// it may have taken effect, so every retry gets the same `500` and nothing runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_past_its_maximum_duration_is_recorded_as_interrupted() {
    let engine = Idempotency::builder(MemoryStore::new())
        .default_max_duration(Duration::from_millis(100))
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    let slow = |runs: &Arc<AtomicUsize>| {
        let runs = runs.clone();
        move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(5)).await;
            StatusCode::CREATED
        }
    };
    let (status, _, body) = body_of(
        engine
            .run(&CONFIG, "alice", "k", fingerprint(1), slow(&runs))
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(problem_code(&body), "request_interrupted");
    let (status, headers, body) = body_of(
        engine
            .run(&CONFIG, "alice", "k", fingerprint(1), slow(&runs))
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(problem_code(&body), "request_interrupted");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// SQLite transactional handlers do not starve the store's pool: sixteen slow
/// transactional requests at once (more than the pool's eight connections) beside plain
/// requests on the same store — no `503` anywhere, every deposit applied exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_sqlite_transactions_leave_the_pool_to_plain_requests() {
    use idempotent_runtime::store::SqliteStore;
    use idempotent_runtime::{Sqlite, Tx};

    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::connect(dir.path().join("pool.db").to_str().unwrap())
        .await
        .unwrap();
    let pool = store.pool().clone();
    sqlx::query("CREATE TABLE deposits (id TEXT PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    let engine = Idempotency::new(store);
    let mut tasks = Vec::new();
    for n in 0..16 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            engine
                .run_in_transaction::<Sqlite, _, _, _>(
                    &CONFIG,
                    "alice",
                    &format!("deposit-{n}"),
                    fingerprint(1),
                    async move |_key, tx: &mut Tx<Sqlite>| {
                        let insert = sqlx::query("INSERT INTO deposits (id) VALUES ($1)")
                            .bind(format!("d{n}"))
                            .execute(tx.conn())
                            .await;
                        tokio::time::sleep(Duration::from_millis(400)).await;
                        insert
                            .map(|_| StatusCode::CREATED)
                            .map_err(|_| StatusCode::CONFLICT)
                    },
                )
                .await
                .status()
        }));
    }
    for n in 0..16 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10 * n)).await;
            engine
                .run(
                    &CONFIG,
                    "bob",
                    &format!("plain-{n}"),
                    fingerprint(2),
                    |_| async { StatusCode::CREATED },
                )
                .await
                .status()
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), StatusCode::CREATED);
    }
    let deposits: i64 = sqlx::query_scalar("SELECT count(*) FROM deposits")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(deposits, 16);
}

/// Operators inspect a recorded key and forget it through the engine: the next request
/// with the key runs the handler again. A running claim is refused unless forced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_inspect_and_forget_through_the_engine() {
    let engine = Idempotency::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(engine.inspect("alice", "k").await.unwrap(), None);
    let first = engine
        .run(&CONFIG, "alice", "k", fingerprint(1), created(&runs))
        .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let info = engine
        .inspect("alice", "k")
        .await
        .unwrap()
        .expect("recorded");
    assert_eq!(info.state, RecordState::Completed { status: 201 });
    assert_eq!(info.fingerprint, fingerprint(1));
    assert_eq!(
        engine.forget("alice", "k", false).await.unwrap(),
        ForgetOutcome::Forgotten(info)
    );
    assert_eq!(engine.inspect("alice", "k").await.unwrap(), None);
    let again = engine
        .run(&CONFIG, "alice", "k", fingerprint(1), created(&runs))
        .await;
    assert_eq!(again.status(), StatusCode::CREATED);
    assert!(again.headers().get("idempotent-replayed").is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 2, "ran as new");

    // A claim held by a running request (made directly on the store here).
    let token = FencingToken::random();
    let claim = ClaimRequest {
        scope: "alice",
        key: "running",
        fingerprint: &fingerprint(1),
        ttl: Duration::from_secs(60),
        lease: Duration::from_secs(30),
        token,
    };
    engine.store().claim(&claim).await.unwrap();
    assert!(matches!(
        engine.forget("alice", "running", false).await.unwrap(),
        ForgetOutcome::Refused { lease_left } if lease_left <= Duration::from_secs(30)
    ));
    assert!(
        engine
            .inspect("alice", "running")
            .await
            .unwrap()
            .expect("still running")
            .holder_alive()
    );
    assert!(matches!(
        engine.forget("alice", "running", true).await.unwrap(),
        ForgetOutcome::Forgotten(_)
    ));
    let response = StoredResponse {
        status: 200,
        headers: Vec::new(),
        body: None,
    };
    assert!(
        !engine
            .store()
            .complete("alice", "running", token, &response)
            .await
            .unwrap(),
        "the forgotten holder is fenced off"
    );
}

/// The operator tools are bounded by the store timeout like every other store call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_tools_time_out_on_a_silent_store() {
    let engine = Idempotency::builder(SilentStore)
        .store_timeout(Duration::from_millis(100))
        .build();
    assert!(matches!(
        engine.inspect("alice", "k").await,
        Err(StoreError::Timeout(_))
    ));
    assert!(matches!(
        engine.forget("alice", "k", true).await,
        Err(StoreError::Timeout(_))
    ));
}

/// A forced forget of a running request: the original's next heartbeat finds its claim
/// gone and tells the handler (`until_lease_lost`), its answer is not recorded, and a
/// retry runs as new.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forced_forget_tells_the_running_handler_it_lost_its_key() {
    let engine = Idempotency::new(MemoryStore::new());
    let config = HandlerConfig::new().lease(Duration::from_secs(3));
    let started = Arc::new(Notify::new());
    let original = {
        let (engine, started) = (engine.clone(), started.clone());
        tokio::spawn(async move {
            engine
                .run(
                    &config,
                    "alice",
                    "k",
                    fingerprint(1),
                    move |key: idempotent_runtime::IdempotencyKey| async move {
                        started.notify_one();
                        key.until_lease_lost().await;
                        StatusCode::SERVICE_UNAVAILABLE
                    },
                )
                .await
        })
    };
    started.notified().await;
    assert!(matches!(
        engine.forget("alice", "k", false).await.unwrap(),
        ForgetOutcome::Refused { .. }
    ));
    assert!(matches!(
        engine.forget("alice", "k", true).await.unwrap(),
        ForgetOutcome::Forgotten(_)
    ));
    let original = tokio::time::timeout(Duration::from_secs(10), original)
        .await
        .expect("the original learns at its next heartbeat that its key is gone")
        .unwrap();
    assert_eq!(original.status(), StatusCode::SERVICE_UNAVAILABLE);
    let runs = Arc::new(AtomicUsize::new(0));
    let retry = engine
        .run(&config, "alice", "k", fingerprint(1), created(&runs))
        .await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The memory store's clock following Tokio's (paused) clock, so that the store's leases
/// and the engine's run on one time line that the test advances.
#[derive(Debug)]
struct TokioClock {
    base_millis: i64,
    start: tokio::time::Instant,
}

impl TokioClock {
    fn store() -> Arc<dyn Store> {
        let clock = TokioClock {
            base_millis: idempotent_runtime::clock::SystemClock.now_millis(),
            start: tokio::time::Instant::now(),
        };
        Arc::new(MemoryStore::with_clock(Arc::new(clock)))
    }
}

impl idempotent_runtime::clock::Clock for TokioClock {
    fn now_millis(&self) -> i64 {
        self.base_millis + i64::try_from(self.start.elapsed().as_millis()).unwrap()
    }
}

use idempotent_runtime::clock::Clock as _;
use idempotent_runtime::testing::faults::{Fault, Faulty, Operation};

/// Two engines over one store, each with the lease `lease`; the first sees the store
/// through `faulty`.
fn two_engines(
    store: &Arc<dyn Store>,
    faulty: &Arc<Faulty>,
    lease: Duration,
) -> (Idempotency, Idempotency) {
    let engine = |store: Arc<dyn Store>| {
        Idempotency::builder_shared(store)
            .default_lease(lease)
            .completion_retry_window(Duration::from_secs(1))
            .replay_cache(None)
            .build()
    };
    (engine(faulty.clone()), engine(store.clone()))
}

/// Interleaving 1 of the protocol review: A's claim is applied at once but answered
/// after its lease ran out; meanwhile a retry on B took the key over and ran. A must not
/// run too.
#[tokio::test(start_paused = true)]
async fn a_claim_answered_after_its_lease_could_have_run_out_does_not_run() {
    let store = TokioClock::store();
    let faulty = Arc::new(Faulty::new(store.clone()));
    faulty.inject(
        Operation::Claim,
        Fault::DelayAnswer(Duration::from_millis(1200)),
    );
    let (a, b) = two_engines(&store, &faulty, Duration::from_millis(600));
    let runs = Arc::new(AtomicUsize::new(0));
    let first = tokio::spawn({
        let (a, runs) = (a.clone(), runs.clone());
        async move {
            a.run(&CONFIG, "acct", "k", fingerprint(1), created(&runs))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    let retry = b
        .run(&CONFIG, "acct", "k", fingerprint(1), created(&runs))
        .await;
    assert_eq!(retry.status(), StatusCode::CREATED, "the retry took over");
    let (status, _, body) = body_of(first.await.unwrap()).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran twice");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(problem_code(&body), "idempotency_store_unavailable");
    // A's release of its late claim is fenced: B's record stands and replays.
    let replay = b
        .run(&CONFIG, "acct", "k", fingerprint(1), created(&runs))
        .await;
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert!(replay.headers().contains_key("idempotent-replayed"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// `lease_lost()` reads the lease's deadline, not only what the heartbeat noticed: with
/// renewals hanging, a handler past its licence (a tenth before the lease's end) is told.
#[tokio::test(start_paused = true)]
async fn lease_lost_turns_true_when_the_licence_ends_without_a_renewal() {
    let store = TokioClock::store();
    let faulty = Arc::new(Faulty::new(store.clone()));
    faulty.inject_always(Operation::Renew, Fault::Hang);
    let (a, _) = two_engines(&store, &faulty, Duration::from_millis(600));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let response = a
        .run(&CONFIG, "acct", "k", fingerprint(1), {
            let seen = seen.clone();
            move |key| async move {
                seen.lock().unwrap().push(key.lease_lost());
                tokio::time::sleep(Duration::from_millis(530)).await;
                seen.lock().unwrap().push(key.lease_lost());
                tokio::time::sleep(Duration::from_millis(30)).await;
                seen.lock().unwrap().push(key.lease_lost());
                StatusCode::SERVICE_UNAVAILABLE
            }
        })
        .await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(*seen.lock().unwrap(), [false, false, true]);
}

/// The completion case of the review: the store applies renewals but refuses every
/// completion. While the lease holds, the engine keeps trying past its retry window, so a
/// retry gets `409` instead of running the handler again; once the store takes the
/// completion, the retry replays it.
#[tokio::test(start_paused = true)]
async fn an_engine_that_holds_the_lease_keeps_trying_to_record() {
    let store = TokioClock::store();
    let faulty = Arc::new(Faulty::new(store.clone()));
    faulty.inject_always(Operation::Complete, Fault::Fail);
    let (a, b) = two_engines(&store, &faulty, Duration::from_millis(600));
    let runs = Arc::new(AtomicUsize::new(0));
    let first = a
        .run(&CONFIG, "acct", "k", fingerprint(1), created(&runs))
        .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let retry = b
        .run(&CONFIG, "acct", "k", fingerprint(1), created(&runs))
        .await;
    assert_eq!(retry.status(), StatusCode::CONFLICT, "the key was given up");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    faulty.heal();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let replay = b
        .run(&CONFIG, "acct", "k", fingerprint(1), created(&runs))
        .await;
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert!(replay.headers().contains_key("idempotent-replayed"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The replay cache's bound on a deleted record counts from when the store read the
/// record, not from when its answer arrived: a replay answered late (here 3 s, within
/// the store timeout) after the key was forgotten and run again elsewhere must not be
/// replayed from the cache for another `max_age` from its arrival. Found by the protocol
/// model (`idempotent-model`, "replays are the record", with a crash and a forget).
#[tokio::test(start_paused = true)]
async fn a_replay_answered_late_is_cached_no_longer_than_max_age_from_its_read() {
    let store = TokioClock::store();
    let faulty = Arc::new(Faulty::new(store.clone()));
    let cached = Idempotency::builder_shared(faulty.clone())
        .replay_cache(Some(
            idempotent_runtime::engine::ReplayCacheConfig::new().max_age(Duration::from_secs(1)),
        ))
        .build();
    let other = Idempotency::builder_shared(store.clone())
        .replay_cache(None)
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    async fn run(engine: &Idempotency, runs: &Arc<AtomicUsize>) -> Vec<u8> {
        let response = engine
            .run(&CONFIG, "acct", "k", fingerprint(1), created(runs))
            .await;
        body_of(response).await.2
    }
    assert_eq!(run(&other, &runs).await, b"{\"run\":1}");
    // The cached engine's claim reads run 1; its answer is 3 s on its way.
    faulty.inject(Operation::Claim, Fault::DelayAnswer(Duration::from_secs(3)));
    let late = tokio::spawn({
        let cached = cached.clone();
        let runs = runs.clone();
        async move {
            cached
                .run(&CONFIG, "acct", "k", fingerprint(1), created(&runs))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    other.forget("acct", "k", false).await.expect("forget");
    assert_eq!(run(&other, &runs).await, b"{\"run\":2}");
    // Run 1 was the record when it was read: a fair answer to that request.
    assert_eq!(
        body_of(late.await.expect("the late replay")).await.2,
        b"{\"run\":1}"
    );
    // 3.2 s after run 1 was read, 2.7 s after the forget: past max_age of both.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        run(&cached, &runs).await,
        b"{\"run\":2}",
        "the cache replayed a record forgotten more than max_age ago"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// An engine over `store` whose handlers may run `max_duration` by default.
fn engine_running_up_to(store: &Arc<dyn Store>, max_duration: Duration) -> Idempotency {
    Idempotency::builder_shared(store.clone())
        .default_max_duration(max_duration)
        .build()
}

const MINUTE: Duration = Duration::from_secs(60);

/// `wait = "6m"` is no mistake on an engine whose handlers may run 10 minutes: a
/// duplicate of an original that answers after 5.5 minutes waits for it and replays it.
#[tokio::test(start_paused = true)]
async fn a_wait_past_five_minutes_waits_as_asked_when_the_handler_may_run_that_long() {
    let store = TokioClock::store();
    let engine = engine_running_up_to(&store, 10 * MINUTE);
    let config = HandlerConfig::new().wait(6 * MINUTE);
    let (runs, started) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
    let original = tokio::spawn({
        let (engine, runs, started) = (engine.clone(), runs.clone(), started.clone());
        async move {
            let handler = move |_key| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                started.notify_one();
                tokio::time::sleep(MINUTE * 11 / 2).await;
                (StatusCode::CREATED, "original")
            };
            engine
                .run(&config, "acct", "k", fingerprint(1), handler)
                .await
        }
    });
    started.notified().await;
    let asked_at = tokio::time::Instant::now();
    let (status, headers, body) = body_of(
        engine
            .run(&config, "acct", "k", fingerprint(1), never)
            .await,
    )
    .await;
    assert_eq!(
        (status, body.as_slice()),
        (StatusCode::CREATED, &b"original"[..])
    );
    assert_eq!(headers["idempotent-replayed"], "true");
    assert!(asked_at.elapsed() >= 5 * MINUTE, "{:?}", asked_at.elapsed());
    assert_eq!(original.await.unwrap().status(), StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The engine cuts a wait to the handler's maximum duration, by which the original has an
/// outcome: a duplicate never waits longer than the handler may run. The original here
/// runs on an instance that lets it run 20 minutes, so only the cut ends the wait.
#[tokio::test(start_paused = true)]
async fn a_wait_is_cut_to_the_handlers_maximum_duration() {
    let store = TokioClock::store();
    let holder = engine_running_up_to(&store, 20 * MINUTE);
    let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let original = tokio::spawn({
        let (holder, started, finish) = (holder.clone(), started.clone(), finish.clone());
        async move {
            let handler = move |_key| async move {
                started.notify_one();
                finish.notified().await;
                StatusCode::CREATED
            };
            holder
                .run(&CONFIG, "acct", "k", fingerprint(1), handler)
                .await
        }
    });
    started.notified().await;
    let config = HandlerConfig::new().wait(6 * MINUTE);
    for (max_duration, waited) in [(5 * MINUTE, 5 * MINUTE), (10 * MINUTE, 6 * MINUTE)] {
        let engine = engine_running_up_to(&store, max_duration);
        let asked_at = tokio::time::Instant::now();
        let response = engine
            .run(&config, "acct", "k", fingerprint(1), never)
            .await;
        let elapsed = asked_at.elapsed();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert!(
            elapsed >= waited && elapsed < waited + Duration::from_secs(1),
            "max {max_duration:?}: waited {elapsed:?}, not {waited:?}"
        );
    }
    finish.notify_one();
    assert_eq!(original.await.unwrap().status(), StatusCode::CREATED);
}

/// The handler of a duplicate that must wait, never run.
async fn never(_key: idempotent_runtime::IdempotencyKey) -> StatusCode {
    panic!("a duplicate must not run")
}
