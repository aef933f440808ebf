//! `state = AppState` names the router state, and the state does not give the engine (no
//! `impl FromRef<AppState> for Idempotency`): the first error is on the attribute's
//! `AppState` and names the impl to write. Axum's own errors at the route follow (the
//! handler is not a `Handler` for a state without the engine); they are the same mistake.

use std::borrow::Cow;

use axum::Router;
use axum::extract::{FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::routing::post;
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::{Idempotency, Scope, idempotent};

#[derive(Clone)]
struct AppState {
    engine: Idempotency,
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

#[idempotent(scope = caller, state = AppState)]
async fn create(caller: Caller, State(app): State<AppState>) -> StatusCode {
    let _ = (caller.0, app.engine);
    StatusCode::CREATED
}

fn main() {
    let state = AppState { engine: Idempotency::new(MemoryStore::new()) };
    let _app: Router = Router::new().route("/notes", post(create)).with_state(state);
}
