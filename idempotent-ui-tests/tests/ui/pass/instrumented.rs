//! `#[tracing::instrument]` on an idempotent handler, in either order: after
//! `#[idempotent]` it instruments the handler's own body (so `skip(caller)` names the
//! user's parameter); before it, it sees the handler as written too.

use std::borrow::Cow;

use axum::Router;
use axum::extract::{FromRef, FromRequestParts};
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

#[idempotent(scope = caller)]
#[tracing::instrument(skip(caller), fields(account = %caller.0))]
async fn create(caller: Caller, body: String) -> StatusCode {
    tracing::info!(len = body.len(), "creating");
    StatusCode::CREATED
}

#[tracing::instrument(skip_all)]
#[idempotent(scope = caller)]
async fn update(caller: Caller, body: String) -> StatusCode {
    let _ = (caller, body);
    StatusCode::OK
}

pub(crate) fn main() {
    let state = AppState {
        engine: Idempotency::new(MemoryStore::new()),
    };
    let _app: Router = Router::new()
        .route("/things", post(create))
        .route("/things/update", post(update))
        .with_state(state);
}
