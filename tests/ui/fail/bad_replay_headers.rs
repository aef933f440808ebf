use axum::http::StatusCode;
use idempotent_runtime::idempotent;

#[idempotent(scope = caller, replay_headers = ["X-Request-Cost", "x request", "set-cookie"])]
async fn create(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::CREATED
}

#[idempotent(scope = caller, replay_headers = "x-request-cost")]
async fn update(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::OK
}

fn main() {
    let _ = (create, update);
}
