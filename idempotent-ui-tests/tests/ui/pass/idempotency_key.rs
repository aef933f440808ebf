//! An `IdempotencyKey` argument (not an extractor) used to derive a downstream key, in
//! any position, under any path.

use std::borrow::Cow;

use axum::extract::{FromRef, FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::routing::post;
use axum::{Json, Router};
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::{Idempotency, IdempotencyKey, Scope, idempotent};
use serde::{Deserialize, Serialize};

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
    type Rejection = StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let value = parts
            .headers
            .get("authorization")
            .ok_or(StatusCode::UNAUTHORIZED)?;
        Ok(Caller(
            String::from_utf8_lossy(value.as_bytes()).into_owned(),
        ))
    }
}

impl Scope for Caller {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.0)
    }
}

#[derive(Deserialize)]
struct Charge {
    amount: u64,
}

#[derive(Serialize)]
struct Charged {
    amount: u64,
    provider_key: String,
}

#[idempotent(scope = caller, ttl = "7d")]
async fn charge(
    key: IdempotencyKey,
    caller: Caller,
    State(_app): State<AppState>,
    Json(charge): Json<Charge>,
) -> Json<Charged> {
    assert_eq!(key.scope(), caller.0);
    Json(Charged {
        amount: charge.amount,
        provider_key: key.derive("charge"),
    })
}

#[idempotent(scope = caller)]
async fn refund(caller: Caller, key: idempotent_runtime::IdempotencyKey) -> String {
    format!("{}:{}", caller.0, key.derive("refund"))
}

pub(crate) fn main() {
    let state = AppState {
        engine: Idempotency::new(MemoryStore::new()),
    };
    let _app: Router = Router::new()
        .route("/charges", post(charge))
        .route("/refunds", post(refund))
        .with_state(state);
}
