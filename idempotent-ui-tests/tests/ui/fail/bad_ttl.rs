use axum::http::StatusCode;
use idempotent_runtime::idempotent;

#[idempotent(scope = caller, ttl = "24 hours")]
async fn create(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::CREATED
}

#[idempotent(scope = caller, ttl = 86400)]
async fn update(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::OK
}

#[idempotent(scope = caller, lease = "1.5s")]
async fn delete(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::OK
}

#[idempotent(scope = caller, max_duration = "30m 1h")]
async fn refund(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::OK
}

fn main() {
    let _ = (create, update, delete, refund);
}
