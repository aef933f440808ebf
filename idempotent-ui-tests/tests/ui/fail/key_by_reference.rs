//! The key is handed over by value; a borrowed key is refused with the fix.

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use idempotent_runtime::{IdempotencyKey, idempotent};

#[idempotent(scope = caller)]
async fn create(caller: String, key: &IdempotencyKey) -> StatusCode {
    let _ = (caller, key.derive("charge"));
    StatusCode::CREATED
}

fn main() {
    let _app: Router = Router::new().route("/notes", post(create));
}
