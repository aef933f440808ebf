use axum::Json;
use axum::http::StatusCode;
use idempotent_runtime::idempotent;

struct Caller(String);

#[idempotent(scope = account)]
async fn create(Caller(account): Caller, Json(body): Json<u64>) -> StatusCode {
    let _ = (account, body);
    StatusCode::CREATED
}

fn main() {
    let _ = create;
}
