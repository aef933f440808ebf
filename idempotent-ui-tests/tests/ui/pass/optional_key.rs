//! `key = optional`: the handler takes `Option<IdempotencyKey>` (or no key argument at
//! all) and builds a router like any other; `key = required` is the default spelled out.

use std::borrow::Cow;

use axum::extract::{FromRef, FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
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
    type Rejection = StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let value = parts
            .headers
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .ok_or(StatusCode::UNAUTHORIZED)?;
        Ok(Caller(value.to_owned()))
    }
}

impl Scope for Caller {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.0)
    }
}

#[idempotent(scope = caller, key = optional, ttl = "1h")]
async fn create(
    caller: Caller,
    key: Option<IdempotencyKey>,
    State(_app): State<AppState>,
    Json(amount): Json<u64>,
) -> Result<(StatusCode, String), StatusCode> {
    let downstream = key.map_or_else(|| "unprotected".to_owned(), |key| key.derive("charge"));
    Ok((
        StatusCode::CREATED,
        format!("{} {amount} {downstream}", caller.0),
    ))
}

#[idempotent(scope = caller, key = optional)]
async fn without_key_argument(caller: Caller) -> StatusCode {
    let _ = caller;
    StatusCode::NO_CONTENT
}

#[idempotent(key = required, scope = caller)]
async fn required(caller: Caller, key: IdempotencyKey) -> String {
    format!("{} {key}", caller.0)
}

pub(crate) fn main() {
    let state = AppState {
        engine: Idempotency::new(MemoryStore::new()),
    };
    let _app: Router = Router::new()
        .route("/create", post(create))
        .route("/ping", post(without_key_argument))
        .route("/required", post(required))
        .with_state(state);
}
