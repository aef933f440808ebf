#![allow(dead_code)]

use axum::Json;
use axum::http::StatusCode;
use idempotent_runtime::idempotent;

#[idempotent(scope = caller)]
async fn create<T: serde::de::DeserializeOwned>(caller: String, Json(body): Json<T>) -> StatusCode {
    let _ = (caller, body);
    StatusCode::CREATED
}

#[idempotent(scope = caller)]
async fn update<'a, const N: usize>(caller: String, _: [u8; N], _: &'a str) -> StatusCode {
    let _ = caller;
    StatusCode::OK
}

#[idempotent(scope = caller)]
async fn delete(caller: String, body: impl serde::de::DeserializeOwned) -> StatusCode {
    let _ = (caller, body);
    StatusCode::OK
}

fn main() {}
