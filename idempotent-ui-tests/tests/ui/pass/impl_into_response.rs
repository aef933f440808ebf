//! `impl IntoResponse` return types, a router state that is only the engine, a `pub`
//! handler with doc comments and other attributes kept.

use std::borrow::Cow;

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::{Idempotency, Scope, idempotent};

pub struct Caller(String);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = (StatusCode, &'static str);

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        match parts
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
        {
            Some(token) => Ok(Caller(token.to_owned())),
            None => Err((StatusCode::UNAUTHORIZED, "who are you?")),
        }
    }
}

impl Scope for Caller {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.0)
    }
}

/// Creates an order.
///
/// Doc comments stay on the handler.
#[idempotent(scope = caller)]
#[allow(clippy::unused_async)]
pub async fn create_order(
    caller: Caller,
    Json(order): Json<serde_json::Value>,
) -> impl IntoResponse {
    (
        StatusCode::CREATED,
        Json(serde_json::json!({ "by": caller.0, "order": order })),
    )
}

#[idempotent(scope = caller)]
pub(crate) async fn cancel_order(caller: Caller, body: String) -> impl IntoResponse + use<> {
    if body.is_empty() {
        return StatusCode::BAD_REQUEST.into_response();
    }
    (StatusCode::OK, caller.0).into_response()
}

pub(crate) fn main() {
    // `Idempotency` is itself the router state: `FromRef<T> for T` is axum's blanket impl.
    let engine = Idempotency::new(MemoryStore::new());
    let _app: Router = Router::new()
        .route("/orders", post(create_order))
        .route("/orders/cancel", post(cancel_order))
        .with_state(engine);
}
