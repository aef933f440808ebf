use axum::http::StatusCode;
use idempotent_runtime::idempotent;

#[idempotent(scope = caller, ttl = "24h", ttl = "1h")]
async fn create(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::CREATED
}

fn main() {
    let _ = create;
}
