use axum::Json;
use axum::http::StatusCode;
use idempotent_runtime::idempotent;

#[idempotent(scope = user)]
async fn create(caller: String, Json(body): Json<u64>) -> StatusCode {
    let _ = (caller, body);
    StatusCode::CREATED
}

#[idempotent(scope = calller)]
async fn update(caller: String, Json(body): Json<u64>) -> StatusCode {
    let _ = (caller, body);
    StatusCode::OK
}

fn main() {
    let _ = (create, update);
}
