//! An idempotent handler as an associated function of an `impl` block (without `Self`).

use std::borrow::Cow;

use axum::Router;
use axum::extract::{FromRef, FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::routing::post;
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::{Idempotency, Scope, idempotent};

#[derive(Clone)]
struct AppState {
    engine: Idempotency,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.engine.clone()
    }
}

/// The authenticated caller (here: the `x-account` header).
struct Caller(String);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let value = parts
            .headers
            .get("x-account")
            .ok_or(StatusCode::UNAUTHORIZED)?;
        Ok(Caller(
            value
                .to_str()
                .map_err(|_| StatusCode::UNAUTHORIZED)?
                .to_owned(),
        ))
    }
}

impl Scope for Caller {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.0)
    }
}

struct Orders;

impl Orders {
    #[idempotent(scope = caller)]
    async fn create(caller: Caller, State(state): State<AppState>, body: String) -> StatusCode {
        let _ = (caller, state.engine, body);
        StatusCode::CREATED
    }
}

pub(crate) fn main() {
    let state = AppState {
        engine: Idempotency::new(MemoryStore::new()),
    };
    let _app: Router = Router::new()
        .route("/orders", post(Orders::create))
        .with_state(state);
}
