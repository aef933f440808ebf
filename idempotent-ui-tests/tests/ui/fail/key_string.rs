//! `key: String` is the request body as text, not the `Idempotency-Key` header.

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use idempotent_runtime::idempotent;

#[idempotent(scope = caller)]
async fn create(caller: String, key: String) -> StatusCode {
    let _ = (caller, key);
    StatusCode::CREATED
}

fn main() {
    let _app: Router = Router::new().route("/notes", post(create));
}
