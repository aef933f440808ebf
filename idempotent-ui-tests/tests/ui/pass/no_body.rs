//! Handlers without a body: only the scope (a `String` extractor), and the scope as the
//! last extractor after `State`. Both get an added `Hashed<()>`.

use axum::Router;
use axum::extract::{FromRef, FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::routing::post;
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::{Idempotency, idempotent};

#[derive(Clone)]
struct AppState {
    engine: Idempotency,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.engine.clone()
    }
}

/// `String` already implements `Scope`.
struct AccountId(String);

impl<S: Send + Sync> FromRequestParts<S> for AccountId {
    type Rejection = StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let value = parts
            .headers
            .get("x-account")
            .ok_or(StatusCode::UNAUTHORIZED)?;
        Ok(AccountId(
            value
                .to_str()
                .map_err(|_| StatusCode::UNAUTHORIZED)?
                .to_owned(),
        ))
    }
}

impl idempotent_runtime::Scope for AccountId {
    fn scope(&self) -> std::borrow::Cow<'_, str> {
        self.0.as_str().into()
    }
}

#[idempotent(scope = account)]
async fn ping(account: AccountId) -> StatusCode {
    if account.0.is_empty() {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::NO_CONTENT
    }
}

#[idempotent(scope = account)]
async fn touch(State(_app): State<AppState>, account: AccountId) {
    let _ = account;
}

pub(crate) fn main() {
    let state = AppState {
        engine: Idempotency::new(MemoryStore::new()),
    };
    let _app: Router = Router::new()
        .route("/ping", post(ping))
        .route("/touch", post(touch))
        .with_state(state);
}
