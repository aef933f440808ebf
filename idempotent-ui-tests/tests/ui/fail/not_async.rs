use axum::http::StatusCode;
use idempotent_runtime::idempotent;

#[idempotent(scope = caller)]
fn create(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::CREATED
}

fn main() {
    let _ = create;
}
