//! `#[axum::debug_handler]` below `#[idempotent]` checks the handler as Axum routes it
//! (the wrapper): without `impl FromRef<AppState> for Idempotency`, it says the engine
//! cannot be taken from the state (`Idempotency: FromRef<AppState>`), at the attribute.

use std::borrow::Cow;

use axum::extract::{FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
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

#[idempotent(scope = caller)]
#[axum::debug_handler(state = AppState)]
async fn create(caller: Caller, State(app): State<AppState>) -> StatusCode {
    let _ = (caller.0, app.engine);
    StatusCode::CREATED
}

fn main() {}
