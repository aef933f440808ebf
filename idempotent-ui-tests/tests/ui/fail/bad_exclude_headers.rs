use axum::http::StatusCode;
use idempotent_runtime::idempotent;

#[idempotent(scope = caller, exclude_headers = ["X-Request-Id", "x request", "set-cookie", "proxy-authenticate"])]
async fn create(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::CREATED
}

#[idempotent(scope = caller, exclude_headers = "x-request-id")]
async fn update(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::OK
}

// The allow-list of earlier versions: every header is replayed now.
#[idempotent(scope = caller, replay_headers = ["x-request-cost"])]
async fn delete(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::OK
}

fn main() {
    let _ = (create, update, delete);
}
