use axum::http::StatusCode;
use idempotent_runtime::idempotent;

#[idempotent(scope = caller, tll = "24h")]
async fn create(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::CREATED
}

#[idempotent(scope = caller, wait = "5s", retries(3))]
async fn update(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::OK
}

fn main() {
    let _ = (create, update);
}
