//! A wait longer than the engine's default maximum duration of 5 minutes compiles: that
//! default is configured at run time, and the engine cuts a wait to the handler's maximum
//! duration. A wait within a `max_duration` written beside it compiles too.

use std::time::Duration;

use axum::Router;
use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::routing::post;
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::{Idempotency, Scope, idempotent};

struct Caller(String);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let account = parts
            .headers
            .get("x-account")
            .ok_or(StatusCode::UNAUTHORIZED)?;
        let account = account.to_str().map_err(|_| StatusCode::UNAUTHORIZED)?;
        Ok(Self(account.to_owned()))
    }
}

impl Scope for Caller {
    fn scope(&self) -> std::borrow::Cow<'_, str> {
        self.0.as_str().into()
    }
}

#[idempotent(scope = caller, wait = "6m")]
async fn settle(caller: Caller) -> StatusCode {
    let _ = caller;
    StatusCode::CREATED
}

#[idempotent(scope = caller, max_duration = "10m", wait = "10m")]
async fn reconcile(caller: Caller) -> StatusCode {
    let _ = caller;
    StatusCode::CREATED
}

pub(crate) fn main() {
    let engine = Idempotency::builder(MemoryStore::new())
        .default_max_duration(Duration::from_secs(10 * 60))
        .build();
    let _app: Router = Router::new()
        .route("/settlements", post(settle))
        .route("/reconciliations", post(reconcile))
        .with_state(engine);
}
