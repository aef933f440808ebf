use axum::http::StatusCode;
use idempotent_runtime::{Postgres, Tx, idempotent};

#[idempotent(scope = caller)]
async fn deposit(caller: String, tx: &Tx<Postgres>) -> Result<StatusCode, StatusCode> {
    let _ = (caller, tx);
    Ok(StatusCode::CREATED)
}

fn main() {
    let _ = deposit;
}
