use axum::http::StatusCode;
use idempotent_runtime::{IdempotencyKey, idempotent};

#[idempotent(scope = caller, key = sometimes)]
async fn create(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::CREATED
}

#[idempotent(scope = caller, key = "optional")]
async fn update(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::OK
}

#[idempotent(scope = caller, key = optional, key = required)]
async fn twice(caller: String) -> StatusCode {
    let _ = caller;
    StatusCode::OK
}

#[idempotent(scope = caller, key = optional)]
async fn wants_a_key(caller: String, key: IdempotencyKey) -> String {
    format!("{caller} {key}")
}

#[idempotent(scope = caller)]
async fn wants_an_optional_key(caller: String, key: Option<IdempotencyKey>) -> String {
    format!("{caller} {key:?}")
}

fn main() {
    let _ = (create, update, twice, wants_a_key, wants_an_optional_key);
}
