use axum::Json;
use axum::http::StatusCode;
use idempotent_runtime::idempotent;

#[idempotent(ttl = "24h")]
async fn create(caller: String, Json(body): Json<u64>) -> StatusCode {
    let _ = (caller, body);
    StatusCode::CREATED
}

fn main() {
    let _ = create;
}
