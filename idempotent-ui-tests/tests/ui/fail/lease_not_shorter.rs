use axum::http::StatusCode;
use idempotent_runtime::idempotent;

#[idempotent(scope = caller, ttl = "1m", lease = "60s")]
async fn create(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::CREATED
}

fn main() {
    let _ = create;
}
