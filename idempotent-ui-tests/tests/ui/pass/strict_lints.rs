//! The expansion is clean under strict lints, also when the user imported the same items
//! the expansion names through `__private` (`Response`, `Scope`, `Guard`, `Hashed`, `Duration`).
#![deny(
    warnings,
    unused,
    unused_qualifications,
    dead_code,
    clippy::all,
    rust_2018_idioms,
    unused_results,
    unused_lifetimes,
    single_use_lifetimes,
    trivial_casts,
    trivial_numeric_casts,
    unreachable_pub,
    variant_size_differences,
    let_underscore_drop,
    redundant_lifetimes,
    unit_bindings
)]

use std::borrow::Cow;

use axum::extract::{FromRef, FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::{Idempotency, IdempotencyKey, Scope, idempotent};

#[derive(Clone)]
struct AppState {
    engine: Idempotency,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.engine.clone()
    }
}

struct Caller(String);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .headers
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .map(|value| Self(value.to_owned()))
            .ok_or_else(|| StatusCode::UNAUTHORIZED.into_response())
    }
}

impl Scope for Caller {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.0)
    }
}

struct Failure;

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        StatusCode::BAD_GATEWAY.into_response()
    }
}

#[idempotent(scope = caller, ttl = "24h", exclude_headers = ["x-request-id"])]
async fn create(
    caller: Caller,
    key: IdempotencyKey,
    State(app): State<AppState>,
    Path(id): Path<u32>,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, Failure> {
    let _engine: &Idempotency = &app.engine;
    if id == 0 {
        return Err(Failure);
    }
    let derived = key.derive("create");
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!([caller.0, derived, body])),
    )
        .into_response())
}

#[idempotent(scope = caller)]
async fn no_body(caller: Caller) -> Response {
    StatusCode::from_u16(if caller.0.is_empty() { 400 } else { 204 })
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        .into_response()
}

#[idempotent(scope = caller, on_server_error = store)]
async fn many_arguments(
    caller: Caller,
    State(_a): State<AppState>,
    Path((_b, _c, _d)): Path<(u8, u8, u8)>,
    _e: HeaderMap,
    _f: Method,
    _g: Uri,
    _h: String,
) -> StatusCode {
    drop(caller);
    StatusCode::OK
}

fn main() {
    let state = AppState {
        engine: Idempotency::new(MemoryStore::new()),
    };
    let _app: Router = Router::new()
        .route("/items/{id}", post(create))
        .route("/ping", post(no_body))
        .route("/wide/{b}/{c}/{d}", post(many_arguments))
        .with_state(state);
}
