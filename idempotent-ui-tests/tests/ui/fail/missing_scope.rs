//! A refused handler still routes: the attribute's error is the only one.

use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use idempotent_runtime::idempotent;

#[idempotent(ttl = "24h")]
async fn create(caller: String, Json(body): Json<u64>) -> StatusCode {
    let _ = (caller, body);
    StatusCode::CREATED
}

fn main() {
    let _app: Router = Router::new().route("/payments", post(create));
}
