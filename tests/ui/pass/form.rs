//! A form body as the last extractor. (`RawForm`: the root package does not enable
//! axum's `form` feature, which `Form<T>` needs; the expansion treats both alike.)

use std::borrow::Cow;

use axum::Router;
use axum::extract::{FromRef, FromRequestParts, RawForm, State};
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
    RawForm(mut form): RawForm,
) -> Result<Redirect, StatusCode> {
    if form.is_empty() {
        return Err(StatusCode::UNPROCESSABLE_ENTITY);
    }
    form.truncate(64);
    account.id.make_ascii_lowercase();
    Ok(Redirect::to(&format!(
        "{}/{}?{}",
        app.prefix,
        account.id,
        form.len()
    )))
}

fn main() {
    let state = AppState {
        engine: Idempotency::new(MemoryStore::new()),
        prefix: "/subscriptions",
    };
    let _app: Router = Router::new()
        .route("/subscriptions", post(subscribe))
        .with_state(state);
}
