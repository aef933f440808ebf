//! A transactional handler returning `impl IntoResponse` without `use<>`: in Rust 2024
//! it captures the `&mut Tx` borrow; refused with the fix.

use std::borrow::Cow;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
// The handler is refused, so no router uses it.
use axum::Json;
//
use idempotent_runtime::{Idempotency, IdempotencyKey, Postgres, Scope, Tx, idempotent};
use serde::Deserialize;

#[derive(Clone)]
struct AppState {
    engine: Idempotency,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.engine.clone()
    }
}

struct Caller(String);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let value = parts
            .headers
            .get("authorization")
            .ok_or(StatusCode::UNAUTHORIZED)?;
        Ok(Caller(
            value
                .to_str()
                .map_err(|_| StatusCode::UNAUTHORIZED)?
                .to_owned(),
        ))
    }
}

impl Scope for Caller {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.0)
    }
}

#[derive(Deserialize)]
struct Deposit {
    amount: i64,
}

struct DbError(sqlx::Error);

impl From<sqlx::Error> for DbError {
    fn from(err: sqlx::Error) -> Self {
        DbError(err)
    }
}

impl IntoResponse for DbError {
    fn into_response(self) -> Response {
        (StatusCode::INTERNAL_SERVER_ERROR, self.0.to_string()).into_response()
    }
}

#[idempotent(scope = caller, ttl = "24h")]
async fn deposit(
    caller: Caller,
    key: IdempotencyKey,
    tx: &mut Tx<Postgres>,
    Json(deposit): Json<Deposit>,
) -> Result<impl IntoResponse, DbError> {
    sqlx::query("INSERT INTO ledger (id, account, amount) VALUES ($1, $2, $3)")
        .bind(key.derive("ledger"))
        .bind(&caller.0)
        .bind(deposit.amount)
        .execute(tx.conn())
        .await?;
    Ok((StatusCode::CREATED, caller.0))
}

fn main() {
    let _ = deposit;
}
