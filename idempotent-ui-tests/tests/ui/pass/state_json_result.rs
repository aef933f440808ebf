//! `State` of a custom app state, a JSON body and a `Result` whose error implements
//! `IntoResponse`; every duration/header option.

use std::borrow::Cow;
use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::{Idempotency, Scope, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Clone)]
struct AppState {
    engine: Idempotency,
    currency: Arc<str>,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.engine.clone()
    }
}

/// The authenticated caller.
struct Caller(String);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .headers
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .map(|value| Caller(value.to_owned()))
            .ok_or(StatusCode::UNAUTHORIZED)
    }
}

impl Scope for Caller {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.0)
    }
}

#[derive(Deserialize)]
struct ChargeRequest {
    amount: u64,
}

#[derive(Serialize)]
struct Payment {
    owner: String,
    amount: u64,
    currency: String,
}

enum ApiError {
    Invalid(&'static str),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Invalid(why) => (StatusCode::BAD_REQUEST, why).into_response(),
        }
    }
}

/// Charges once per key.
#[idempotent(
    scope = caller,
    ttl = "24h",
    lease = "10s",
    wait = "5s",
    on_server_error = release,
    fingerprint = "raw",
    exclude_headers = ["x-request-id"],
)]
async fn create_payment(
    caller: Caller,
    State(app): State<AppState>,
    Json(req): Json<ChargeRequest>,
) -> Result<(StatusCode, HeaderMap, Json<Payment>), ApiError> {
    if req.amount == 0 {
        return Err(ApiError::Invalid("amount must be positive"));
    }
    let mut headers = HeaderMap::new();
    headers.insert("x-request-cost", "1".parse().expect("a valid header value"));
    let payment = Payment {
        owner: caller.0,
        amount: req.amount,
        currency: app.currency.to_string(),
    };
    Ok((StatusCode::CREATED, headers, Json(payment)))
}

pub(crate) fn main() {
    let state = AppState {
        engine: Idempotency::new(MemoryStore::new()),
        currency: Arc::from("BRL"),
    };
    let _app: Router = Router::new()
        .route("/payments", post(create_payment))
        .with_state(state);
}
