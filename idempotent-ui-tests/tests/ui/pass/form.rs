//! A form body (`Form<T>`) as the last extractor.

use std::borrow::Cow;

use axum::Form;
use axum::Router;
use axum::extract::{FromRef, FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::Redirect;
use axum::routing::post;
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::{Idempotency, Scope, idempotent};

#[derive(Clone)]
pub struct AppState {
    engine: Idempotency,
    prefix: &'static str,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.engine.clone()
    }
}

#[derive(serde::Deserialize)]
pub struct Subscription {
    plan: String,
}

pub struct Account {
    id: String,
}

impl<S: Send + Sync> FromRequestParts<S> for Account {
    type Rejection = StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let id = parts
            .headers
            .get("authorization")
            .ok_or(StatusCode::UNAUTHORIZED)?
            .to_str()
            .map_err(|_| StatusCode::UNAUTHORIZED)?
            .to_owned();
        Ok(Account { id })
    }
}

impl Scope for Account {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.id)
    }
}

#[idempotent(scope = account, lease = "5s")]
pub async fn subscribe(
    mut account: Account,
    State(app): State<AppState>,
    Form(Subscription { mut plan }): Form<Subscription>,
) -> Result<Redirect, StatusCode> {
    if plan.is_empty() {
        return Err(StatusCode::UNPROCESSABLE_ENTITY);
    }
    plan.truncate(64);
    account.id.make_ascii_lowercase();
    Ok(Redirect::to(&format!(
        "{}/{}?plan={plan}",
        app.prefix, account.id
    )))
}

pub(crate) fn main() {
    let state = AppState {
        engine: Idempotency::new(MemoryStore::new()),
        prefix: "/subscriptions",
    };
    let _app: Router = Router::new()
        .route("/subscriptions", post(subscribe))
        .with_state(state);
}
