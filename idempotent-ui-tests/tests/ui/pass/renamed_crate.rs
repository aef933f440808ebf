//! `crate = "..."`: the runtime reached under another name, through a `use` alias and
//! through an `extern crate` alias.

extern crate idempotent_runtime as idem_alias;

use std::borrow::Cow;

use axum::Router;
use axum::extract::{FromRef, FromRequestParts};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::routing::post;
use idempotent_runtime as renamed;

#[derive(Clone)]
struct AppState {
    engine: renamed::Idempotency,
}

impl FromRef<AppState> for renamed::Idempotency {
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
            value
                .to_str()
                .map_err(|_| StatusCode::UNAUTHORIZED)?
                .to_owned(),
        ))
    }
}

impl renamed::Scope for Caller {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.0)
    }
}

mod handlers {
    use super::{Caller, renamed};

    #[renamed::idempotent(scope = caller, crate = "renamed", ttl = "15m")]
    pub(crate) async fn through_use(caller: Caller, body: String) -> String {
        format!("{}{body}", caller.0)
    }

    #[idem_alias::idempotent(scope = caller, crate = "::idem_alias")]
    pub(crate) async fn through_extern_crate(
        caller: Caller,
        key: renamed::IdempotencyKey,
    ) -> String {
        key.derive(&caller.0)
    }
}

fn main() {
    let state = AppState {
        engine: renamed::Idempotency::new(renamed::store::MemoryStore::new()),
    };
    let _app: Router = Router::new()
        .route("/a", post(handlers::through_use))
        .route("/b", post(handlers::through_extern_crate))
        .with_state(state);
}
