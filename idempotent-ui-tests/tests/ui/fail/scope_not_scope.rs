use axum::Json;
use axum::http::{HeaderMap, StatusCode};
use idempotent_runtime::idempotent;

#[idempotent(scope = headers)]
async fn create(headers: HeaderMap, Json(body): Json<u64>) -> StatusCode {
    let _ = (headers, body);
    StatusCode::CREATED
}

fn main() {
    let _ = create;
}
