use axum::http::StatusCode;
use idempotent_runtime::idempotent;

#[idempotent(scope = caller, fingerprint = "sha256")]
async fn create(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::CREATED
}

#[idempotent(scope = caller, fingerprint = json)]
async fn update(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::OK
}

fn main() {
    let _ = (create, update);
}
