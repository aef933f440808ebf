use axum::http::StatusCode;
use idempotent_runtime::idempotent;

#[idempotent(scope = caller, on_server_error = retry)]
async fn create(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::CREATED
}

#[idempotent(scope = caller, on_server_error = "store")]
async fn update(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::OK
}

fn main() {
    let _ = (create, update);
}
