use axum::http::StatusCode;
use idempotent_runtime::idempotent;

#[idempotent(scope = caller, max_duration = "30s", wait = "1m")]
async fn create(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::CREATED
}

#[idempotent(scope = caller, wait = "0s")]
async fn update(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::OK
}

fn main() {
    let _ = (create, update);
}
