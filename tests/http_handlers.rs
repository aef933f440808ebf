//! End-to-end behaviour that needs handlers of its own (panics, per-request headers,
//! body limits) or a real TCP connection (a client hanging up).

mod support;

#[path = "support/process.rs"]
mod process;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, FromRef, State};
use axum::routing::post;
use axum::{Json, Router};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::{Idempotency, idempotent};
use support::send;
use tokio::io::AsyncWriteExt;

#[derive(Clone)]
struct TestState {
    idempotency: Idempotency,
    runs: Arc<AtomicUsize>,
}

impl FromRef<TestState> for Idempotency {
    fn from_ref(state: &TestState) -> Self {
        state.idempotency.clone()
    }
}

#[idempotent(scope = caller)]
async fn panics(caller: Caller, State(state): State<TestState>) -> StatusCode {
    let _ = caller;
    if state.runs.fetch_add(1, Ordering::SeqCst) == 0 {
        panic!("first attempt fails");
    }
    StatusCode::CREATED
}

#[idempotent(scope = caller)]
async fn with_date(
    caller: Caller,
    State(state): State<TestState>,
) -> (StatusCode, HeaderMap, &'static str) {
    let _ = caller;
    state.runs.fetch_add(1, Ordering::SeqCst);
    let mut headers = HeaderMap::new();
    headers.insert(
        header::DATE,
        HeaderValue::from_static("Sat, 01 Jan 2000 00:00:00 GMT"),
    );
    headers.insert("set-cookie", HeaderValue::from_static("session=secret"));
    headers.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
    (StatusCode::CREATED, headers, "ok")
}

#[idempotent(scope = caller)]
async fn echo(
    caller: Caller,
    State(state): State<TestState>,
    Json(body): Json<serde_json::Value>,
) -> Json<serde_json::Value> {
    let _ = caller;
    state.runs.fetch_add(1, Ordering::SeqCst);
    Json(body)
}

/// The caller of these tests: always the same account (the demo shows real bearer
/// authentication).
struct Caller;

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
    type Rejection = StatusCode;
    async fn from_request_parts(_: &mut http::request::Parts, _: &S) -> Result<Self, StatusCode> {
        Ok(Caller)
    }
}

impl idempotent_runtime::Scope for Caller {
    fn scope(&self) -> std::borrow::Cow<'_, str> {
        "acct_test".into()
    }
}

fn app() -> (Router, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let state = TestState {
        idempotency: Idempotency::new(MemoryStore::new()),
        runs: runs.clone(),
    };
    let router = Router::new()
        .route("/panics", post(panics))
        .route("/date", post(with_date))
        .route("/echo", post(echo))
        .layer(DefaultBodyLimit::max(1024))
        .with_state(state);
    (router, runs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_routes_fingerprint_the_full_path() {
    let runs = Arc::new(AtomicUsize::new(0));
    let state = TestState {
        idempotency: Idempotency::new(MemoryStore::new()),
        runs: runs.clone(),
    };
    let accounts = Router::new().route("/transfers", post(echo));
    let app = Router::new()
        .nest("/accounts/{id}", accounts)
        .with_state(state);
    let first = send(
        &app,
        request("/accounts/A/transfers", "k", "{\"amount\":1}"),
    )
    .await;
    assert_eq!(first.status, StatusCode::OK);
    let other_account = send(
        &app,
        request("/accounts/B/transfers", "k", "{\"amount\":1}"),
    )
    .await;
    assert_eq!(
        other_account.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "another resource under the same key is another request, not a replay"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

fn request(
    uri: &str,
    key: &str,
    body: impl Into<axum::body::Body>,
) -> http::Request<axum::body::Body> {
    http::Request::post(uri)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_is_500_problem_and_the_retry_runs_again() {
    let (app, runs) = app();
    let failed = send(&app, request("/panics", "k", "")).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        failed.header("content-type"),
        Some("application/problem+json")
    );
    let retry = send(&app, request("/panics", "k", "")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_request_headers_are_never_replayed() {
    let (app, runs) = app();
    let first = send(&app, request("/date", "k", "")).await;
    assert_eq!(first.header("date"), Some("Sat, 01 Jan 2000 00:00:00 GMT"));
    let replay = send(&app, request("/date", "k", "")).await;
    assert!(replay.replayed());
    assert_eq!(replay.header("date"), None, "Date is not stored");
    assert_eq!(
        replay.header("set-cookie"),
        None,
        "Set-Cookie is not stored"
    );
    assert_eq!(replay.header("etag"), Some("\"v1\""));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_over_the_limit_is_413_and_claims_nothing() {
    let (app, runs) = app();
    let big = format!("\"{}\"", "x".repeat(2048));
    let refused = send(&app, request("/echo", "k", big)).await;
    assert_eq!(refused.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json"),
        "the library's own body read answers in the library's format"
    );
    let ok = send(&app, request("/echo", "k", "{\"a\":1}")).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert!(
        !ok.replayed(),
        "the refused request stored nothing under the key"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_hanging_up_mid_request_still_records_the_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let (app, gateway) = support::payments_app(dir.path(), Duration::from_millis(400)).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let body = r#"{"amount": 10000, "currency": "BRL"}"#;
    let raw = format!(
        "POST /payments HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer sk_test_alice\r\n\
         idempotency-key: hangup-1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket.write_all(raw.as_bytes()).await.unwrap();
    let records = sqlx::SqlitePool::connect(&format!(
        "sqlite://{}",
        dir.path().join("payments.db").display()
    ))
    .await
    .unwrap();
    process::wait_until("the request is claimed", || {
        process::claimed(&records, "hangup-1")
    })
    .await;
    drop(socket); // hang up while the gateway call (400 ms) is in flight

    let client = reqwest::Client::new();
    let mut replayed = None;
    for _ in 0..100 {
        let response = client
            .post(format!("http://{addr}/payments"))
            .header("authorization", "Bearer sk_test_alice")
            .header("idempotency-key", "hangup-1")
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        if response.status() == StatusCode::CONFLICT {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        replayed = Some(response);
        break;
    }
    let replayed = replayed.expect("the original finished");
    assert_eq!(replayed.status(), StatusCode::CREATED);
    assert_eq!(replayed.headers()["idempotent-replayed"], "true");
    assert_eq!(gateway.calls().await.unwrap(), 1, "charged exactly once");
    server.abort();
}
