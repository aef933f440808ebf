//! Two apps with the same routes and the same plain handler logic ([`charge`]): one
//! protected by `#[idempotent]`, one by `IdempotencyLayer`. The contract checks in
//! `tests/contract.rs` run against both.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, FromRef, FromRequestParts, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use idempotent_demo::auth::Caller;
use idempotent_runtime::clock::ManualClock;
use idempotent_runtime::layer::IdempotencyLayer;
use idempotent_runtime::rejection::AsProblem;
use idempotent_runtime::store::SqliteStore;
use idempotent_runtime::{Idempotency, IdempotencyKey, Problem, idempotent};

/// How the app's routes are protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protection {
    /// `#[idempotent(scope = caller)]` handlers.
    Attribute,
    /// Plain handlers under `IdempotencyLayer`.
    Layer,
}

/// The largest request body the apps accept (`DefaultBodyLimit`).
pub(crate) const BODY_LIMIT: usize = 1024;

/// An app under test on a real SQLite file, with the clock its store keeps time by.
pub(crate) struct ContractApp {
    pub(crate) router: Router,
    /// How often the handler logic ran.
    pub(crate) runs: Arc<AtomicUsize>,
    pub(crate) clock: ManualClock,
    /// The store's database, to watch claims from outside.
    pub(crate) records: sqlx::SqlitePool,
    _dir: tempfile::TempDir,
}

impl ContractApp {
    /// The app, its handler taking `latency` for each charge.
    pub(crate) async fn new(protection: Protection, latency: Duration) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let clock = ManualClock::new();
        let path = dir.path().join("contract.db");
        let store = SqliteStore::connect_with_clock(
            path.to_str().expect("utf-8 path"),
            Arc::new(clock.clone()),
        )
        .await
        .expect("open the store");
        let records = store.pool().clone();
        let state = AppState {
            idempotency: Idempotency::new(store),
            runs: Arc::new(AtomicUsize::new(0)),
            latency,
        };
        let runs = state.runs.clone();
        let router = match protection {
            Protection::Attribute => attribute_router(state),
            Protection::Layer => layer_router(state),
        };
        Self {
            router,
            runs,
            clock,
            records,
            _dir: dir,
        }
    }

    pub(crate) fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

#[derive(Clone)]
struct AppState {
    idempotency: Idempotency,
    runs: Arc<AtomicUsize>,
    latency: Duration,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.idempotency.clone()
    }
}

/// The body of a charge.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct ChargeRequest {
    #[serde(default)]
    amount: i64,
    #[serde(default)]
    currency: String,
}

/// The handler logic both apps share: `40200` is declined (`402`), `50300` a gateway
/// outage (`503`), a non-positive amount invalid (`400`), anything else `201` with a
/// `Location`, an `ETag` and per-response headers (`Date`, `Set-Cookie`).
async fn charge(
    state: AppState,
    caller: Caller,
    key: Option<IdempotencyKey>,
    request: ChargeRequest,
) -> Response {
    let run = state.runs.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(state.latency).await;
    let problem = |status, code: &str, detail: &str| {
        Problem::new(status, code, code, detail.to_owned()).into_response()
    };
    match request.amount {
        amount if amount <= 0 => {
            return problem(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "Amount must be positive.",
            );
        }
        40200 => return problem(StatusCode::PAYMENT_REQUIRED, "card_declined", "Declined."),
        50300 => {
            return problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "gateway_unavailable",
                "Nothing was charged.",
            );
        }
        _ => {}
    }
    let id = match &key {
        Some(key) => format!("pay_{}", &key.derive("charge")[5..21]),
        None => format!("pay_unprotected_{run}"),
    };
    let mut headers = HeaderMap::new();
    let location = HeaderValue::try_from(format!("/payments/{id}")).expect("header value");
    headers.insert(header::LOCATION, location);
    headers.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
    headers.insert(
        header::DATE,
        HeaderValue::from_static("Sat, 01 Jan 2000 00:00:00 GMT"),
    );
    headers.insert(
        header::SET_COOKIE,
        HeaderValue::from_static("session=secret"),
    );
    let body = serde_json::json!({
        "id": id,
        "amount": request.amount,
        "currency": request.currency,
        "owner": caller.account(),
        "run": run,
    });
    (StatusCode::CREATED, headers, Json(body)).into_response()
}

/// Panics on its first run, answers `201` after.
fn panic_first_time(state: &AppState) -> StatusCode {
    if state.runs.fetch_add(1, Ordering::SeqCst) == 0 {
        idempotent_runtime::testing::panic_deliberately("a handler's first attempt fails");
    }
    StatusCode::CREATED
}

// ---- the attribute app -------------------------------------------------------------

#[idempotent(scope = caller)]
async fn attribute_payment(
    caller: Caller,
    key: IdempotencyKey,
    State(state): State<AppState>,
    AsProblem(Json(request)): AsProblem<Json<ChargeRequest>>,
) -> Response {
    charge(state, caller, Some(key), request).await
}

#[idempotent(scope = caller, key = optional)]
async fn attribute_optional_payment(
    caller: Caller,
    key: Option<IdempotencyKey>,
    State(state): State<AppState>,
    AsProblem(Json(request)): AsProblem<Json<ChargeRequest>>,
) -> Response {
    charge(state, caller, key, request).await
}

/// Duplicates that find the charge running wait for it (up to a minute) and replay it.
#[idempotent(scope = caller, wait = "60s")]
async fn attribute_waiting_payment(
    caller: Caller,
    key: IdempotencyKey,
    State(state): State<AppState>,
    AsProblem(Json(request)): AsProblem<Json<ChargeRequest>>,
) -> Response {
    charge(state, caller, Some(key), request).await
}

#[idempotent(scope = caller)]
async fn attribute_panics(caller: Caller, State(state): State<AppState>) -> StatusCode {
    let _ = caller;
    panic_first_time(&state)
}

fn attribute_router(state: AppState) -> Router {
    let accounts = Router::new().route("/transfers", post(attribute_payment));
    Router::new()
        .route("/payments", post(attribute_payment))
        .route("/optional/payments", post(attribute_optional_payment))
        .route("/waiting/payments", post(attribute_waiting_payment))
        .route("/panics", post(attribute_panics))
        .nest("/accounts/{id}", accounts)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

// ---- the layer app -----------------------------------------------------------------

/// The app's authentication layer: the `Caller` extension is the layer's scope.
async fn authenticate(request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    match Caller::from_request_parts(&mut parts, &()).await {
        Ok(caller) => {
            parts.extensions.insert(caller);
            next.run(Request::from_parts(parts, body)).await
        }
        Err(rejection) => rejection,
    }
}

async fn plain_payment(
    Extension(caller): Extension<Caller>,
    Extension(key): Extension<IdempotencyKey>,
    State(state): State<AppState>,
    AsProblem(Json(request)): AsProblem<Json<ChargeRequest>>,
) -> Response {
    charge(state, caller, Some(key), request).await
}

async fn plain_optional_payment(
    Extension(caller): Extension<Caller>,
    key: Option<Extension<IdempotencyKey>>,
    State(state): State<AppState>,
    AsProblem(Json(request)): AsProblem<Json<ChargeRequest>>,
) -> Response {
    charge(state, caller, key.map(|Extension(key)| key), request).await
}

async fn plain_panics(State(state): State<AppState>) -> StatusCode {
    panic_first_time(&state)
}

fn layer_router(state: AppState) -> Router {
    let protect =
        || IdempotencyLayer::new(state.idempotency.clone()).scope_from_extension::<Caller>();
    // Inside a nested router: the layer sees the URI without its prefix.
    let accounts = Router::new()
        .route("/transfers", post(plain_payment))
        .route_layer(protect());
    let optional = Router::new()
        .route("/optional/payments", post(plain_optional_payment))
        .route_layer(protect().key_optional());
    let waiting = Router::new()
        .route("/waiting/payments", post(plain_payment))
        .route_layer(protect().wait(Duration::from_secs(60)));
    Router::new()
        .route("/payments", post(plain_payment))
        .route("/panics", post(plain_panics))
        .route_layer(protect())
        .merge(optional)
        .merge(waiting)
        .nest("/accounts/{id}", accounts)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn(authenticate))
        .with_state(state)
}
