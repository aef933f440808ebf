use axum::http::StatusCode;
use idempotent_runtime::idempotent;

#[idempotent(scope = caller)]
async fn create(caller: String, #[cfg(any())] extra: String, body: String) -> StatusCode {
    let _ = (caller, body);
    StatusCode::CREATED
}

fn main() {
    let _ = create;
}
