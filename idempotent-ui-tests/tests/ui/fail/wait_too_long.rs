use axum::http::StatusCode;
use idempotent_runtime::idempotent;

// Refused only against a `max_duration` written here: the engine's default is configured
// at run time (see `tests/ui/pass/long_wait.rs`).
#[idempotent(scope = caller, max_duration = "30s", wait = "1m")]
async fn create(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::CREATED
}

#[idempotent(scope = caller, wait = "0s")]
async fn update(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::OK
}

fn main() {
    let _ = (create, update);
}
