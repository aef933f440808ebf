//! An application with its own error envelope (`{"error": {"code", "message"}}`) renders
//! the library's own answers through `IdempotencyBuilder::render_problems`: the same on
//! the attribute's path, the layer's and the webhook door's, with the engine's status and
//! headers kept whatever the renderer returns; without a renderer they stay problem+json.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, FromRef, FromRequestParts, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use http::request::Parts;
use http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::webhook::WebhookVerifier;
use idempotent_runtime::{Idempotency, IdempotencyLayer, Problem, Scope, idempotent};
use serde_json::{Value, json};
use tokio::sync::watch;
use tower::ServiceExt;

/// The application's envelope. It also answers `418` with its own `Retry-After`, which
/// the engine must override: clients retry by the engine's status and headers.
fn envelope(problem: Problem) -> Response {
    let body = json!({ "error": { "code": problem.code, "message": problem.detail } });
    (
        StatusCode::IM_A_TEAPOT,
        [(header::RETRY_AFTER, "999")],
        Json(body),
    )
        .into_response()
}

#[derive(Clone)]
struct AppState {
    engine: Idempotency,
    /// Handlers whose body is `hold` wait for this to be `true`.
    release: Arc<watch::Sender<bool>>,
    /// How many handler runs have started.
    started: Arc<AtomicUsize>,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.engine.clone()
    }
}

impl AppState {
    /// The handler's work: holds while the test keeps a duplicate waiting.
    async fn pay(&self, body: String) -> (StatusCode, String) {
        self.started.fetch_add(1, Ordering::SeqCst);
        if body == "hold" {
            let _ = self.release.subscribe().wait_for(|open| *open).await;
        }
        (StatusCode::CREATED, format!("paid {body}"))
    }
}

/// One fixed caller.
struct Caller;

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = StatusCode;

    async fn from_request_parts(_: &mut Parts, _: &S) -> Result<Self, StatusCode> {
        Ok(Caller)
    }
}

impl Scope for Caller {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed("acct_envelope")
    }
}

#[idempotent(scope = caller)]
async fn attr_pay(
    caller: Caller,
    State(state): State<AppState>,
    body: String,
) -> (StatusCode, String) {
    let _ = caller;
    state.pay(body).await
}

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// `/attr` through the attribute, `/layer` through the layer, `/webhooks` through the
/// layer's webhook door; bodies over 64 bytes are refused.
fn app(engine: Idempotency) -> (Router, AppState) {
    let state = AppState {
        engine,
        release: Arc::new(watch::Sender::new(false)),
        started: Arc::default(),
    };
    let layer_state = state.clone();
    let layered = Router::new()
        .route(
            "/layer",
            post(move |body: String| {
                let state = layer_state.clone();
                async move { state.pay(body).await }
            }),
        )
        .route_layer(
            IdempotencyLayer::new(state.engine.clone())
                .scope_with(|_| Some("acct_envelope".to_owned())),
        );
    let verifier = WebhookVerifier::new([SECRET]).unwrap();
    let webhooks = Router::new()
        .route("/webhooks", post(|| async { StatusCode::OK }))
        .route_layer(
            IdempotencyLayer::new(state.engine.clone()).standard_webhooks("gateway", verifier),
        );
    let router = Router::new()
        .route("/attr", post(attr_pay))
        .with_state(state.clone())
        .merge(layered)
        .merge(webhooks)
        .layer(DefaultBodyLimit::max(64));
    (router, state)
}

fn request(path: &str, key: Option<&str>, body: &str) -> Request<Body> {
    let mut request = Request::post(path);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request.body(Body::from(body.to_owned())).unwrap()
}

/// What the client sees: status, `Content-Type`, `Retry-After`, `Idempotent-Replayed`,
/// and the body.
struct Seen {
    status: StatusCode,
    content_type: Option<String>,
    retry_after: Option<String>,
    replayed: bool,
    body: Vec<u8>,
}

impl Seen {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    /// The envelope's code, asserting the body is the application's envelope.
    fn envelope_code(&self) -> String {
        assert_eq!(self.content_type.as_deref(), Some("application/json"));
        let body = self.json();
        assert!(body.get("type").is_none(), "not problem+json: {body}");
        let message = body["error"]["message"].as_str().expect("a message");
        assert!(!message.is_empty());
        body["error"]["code"].as_str().expect("a code").to_owned()
    }
}

async fn send(app: &Router, request: Request<Body>) -> Seen {
    let (head, body) = app.clone().oneshot(request).await.unwrap().into_parts();
    let header = |name: &str| {
        head.headers
            .get(name)
            .map(|value| value.to_str().unwrap().to_owned())
    };
    let (content_type, retry_after) = (header("content-type"), header("retry-after"));
    let replayed = header("idempotent-replayed").as_deref() == Some("true");
    let status = head.status;
    let body = body.collect().await.unwrap().to_bytes();
    Seen {
        status,
        content_type,
        retry_after,
        replayed,
        body: body.to_vec(),
    }
}

/// On one path: a duplicate of a running request (`409`, the engine's `Retry-After`), a
/// key reused with another body (`422`), a missing key (`400`) and a body over the limit
/// (`413`) answer in the envelope; the handler's own answer and its replay do not.
async fn the_library_answers_in_the_envelope_on(path: &str) {
    let engine = Idempotency::builder(MemoryStore::new())
        .render_problems(envelope)
        .build();
    let (app, state) = app(engine);

    let original = tokio::spawn({
        let app = app.clone();
        let path = path.to_owned();
        async move { send(&app, request(&path, Some("k-1"), "hold")).await }
    });
    while state.started.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let duplicate = send(&app, request(path, Some("k-1"), "hold")).await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT, "{path}");
    assert_eq!(duplicate.envelope_code(), "request_in_progress", "{path}");
    let retry_after = duplicate.retry_after.expect("Retry-After");
    assert_ne!(
        retry_after, "999",
        "{path}: the engine's Retry-After, not the renderer's"
    );
    assert!(retry_after.parse::<u64>().unwrap() >= 1, "{path}");

    state.release.send_replace(true);
    let original = original.await.unwrap();
    assert_eq!(original.status, StatusCode::CREATED, "{path}");
    assert_eq!(original.body, b"paid hold", "{path}");
    let replay = send(&app, request(path, Some("k-1"), "hold")).await;
    assert_eq!(
        (replay.status, replay.replayed, replay.body.as_slice()),
        (StatusCode::CREATED, true, &b"paid hold"[..]),
        "{path}"
    );

    let reused = send(&app, request(path, Some("k-1"), "another body")).await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY, "{path}");
    assert_eq!(reused.envelope_code(), "idempotency_key_reused", "{path}");

    let missing = send(&app, request(path, None, "hold")).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST, "{path}");
    assert_eq!(missing.envelope_code(), "idempotency_key_missing", "{path}");

    let too_large = send(&app, request(path, Some("k-2"), &"x".repeat(65))).await;
    assert_eq!(too_large.status, StatusCode::PAYLOAD_TOO_LARGE, "{path}");
    assert_eq!(too_large.envelope_code(), "payload_too_large", "{path}");
    assert_eq!(state.started.load(Ordering::SeqCst), 1, "{path}: one run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_attribute_answers_in_the_applications_envelope() {
    the_library_answers_in_the_envelope_on("/attr").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_layer_answers_in_the_applications_envelope() {
    the_library_answers_in_the_envelope_on("/layer").await;
}

/// A delivery that fails verification is `401` in the envelope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unverified_webhook_is_refused_in_the_applications_envelope() {
    let engine = Idempotency::builder(MemoryStore::new())
        .render_problems(envelope)
        .build();
    let (app, _) = app(engine);
    let unsigned = Request::post("/webhooks")
        .header("webhook-id", "evt_1")
        .body(Body::from("{}"))
        .unwrap();
    let refused = send(&app, unsigned).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(refused.envelope_code(), "webhook_unverified");
}

/// Without a renderer the library's answers stay problem+json.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_renderer_the_answers_stay_problem_json() {
    let (app, _) = app(Idempotency::new(MemoryStore::new()));
    for path in ["/attr", "/layer"] {
        let missing = send(&app, request(path, None, "body")).await;
        assert_eq!(missing.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            missing.content_type.as_deref(),
            Some("application/problem+json")
        );
        assert_eq!(missing.json()["code"], "idempotency_key_missing", "{path}");
    }
}
