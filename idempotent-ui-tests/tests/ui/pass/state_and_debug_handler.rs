//! `state = AppState` (the state is checked to give the engine), and
//! `#[axum::debug_handler]` below `#[idempotent]`, where it checks the handler Axum routes:
//! with the key argument, a transaction and a JSON body, and with the state inferred from
//! a `State` argument.

use std::borrow::Cow;

use axum::extract::{FromRef, FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::routing::post;
use axum::{Json, Router};
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::{Idempotency, IdempotencyKey, Postgres, Scope, Tx, idempotent};

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

    async fn from_request_parts(_: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Caller("acct_alice".to_owned()))
    }
}

impl Scope for Caller {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.0)
    }
}

#[idempotent(scope = caller, state = AppState, ttl = "1h 30m", lease = "1s500ms")]
async fn named_state(caller: Caller, key: IdempotencyKey, Json(amount): Json<u64>) -> String {
    format!("{} {amount} {}", caller.0, key.derive("charge"))
}

#[idempotent(scope = caller, state = AppState)]
#[axum::debug_handler(state = AppState)]
async fn checked(caller: Caller, key: IdempotencyKey, Json(amount): Json<u64>) -> String {
    format!("{} {amount} {}", caller.0, key.derive("charge"))
}

#[idempotent(scope = caller)]
#[axum::debug_handler]
async fn state_inferred(caller: Caller, State(app): State<AppState>, body: String) -> StatusCode {
    let _ = (caller.0, app.engine, body);
    StatusCode::CREATED
}

#[idempotent(scope = caller)]
#[axum::debug_handler(state = AppState)]
async fn transactional(caller: Caller, tx: &mut Tx<Postgres>) -> Result<StatusCode, StatusCode> {
    let _ = (caller.0, tx.conn());
    Ok(StatusCode::CREATED)
}

pub(crate) fn main() {
    let state = AppState {
        engine: Idempotency::new(MemoryStore::new()),
    };
    let _app: Router = Router::new()
        .route("/named", post(named_state))
        .route("/checked", post(checked))
        .route("/inferred", post(state_inferred))
        .route("/notes", post(transactional))
        .with_state(state);
}
