//! `Path` and `Query` extractors (no body: the last one is hashed), a stored 5xx policy
//! and the JSON fingerprint.

use std::borrow::Cow;

use axum::extract::{FromRef, FromRequestParts, Path, Query};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::routing::post;
use axum::{Json, Router};
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::{Idempotency, Scope, idempotent};
use serde::Deserialize;

#[derive(Clone)]
struct AppState {
    engine: Idempotency,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.engine.clone()
    }
}

struct Caller(u64);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .headers
            .get("x-account")
            .and_then(|value| value.to_str().ok()?.parse().ok())
            .map(Caller)
            .ok_or(StatusCode::UNAUTHORIZED)
    }
}

impl Scope for Caller {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Owned(self.0.to_string())
    }
}

#[derive(Deserialize)]
struct CaptureQuery {
    amount: Option<u64>,
}

#[idempotent(scope = caller, on_server_error = store, fingerprint = "json", ttl = "1h30m")]
async fn capture(
    Path((payment_id, attempt)): Path<(String, u32)>,
    caller: Caller,
    Query(query): Query<CaptureQuery>,
) -> (StatusCode, Json<serde_json::Value>) {
    let body = serde_json::json!({
        "payment": payment_id,
        "attempt": attempt,
        "account": caller.0,
        "amount": query.amount,
    });
    (StatusCode::OK, Json(body))
}

pub(crate) fn main() {
    let state = AppState {
        engine: Idempotency::new(MemoryStore::new()),
    };
    let _app: Router = Router::new()
        .route("/payments/{id}/{attempt}/capture", post(capture))
        .with_state(state);
}
