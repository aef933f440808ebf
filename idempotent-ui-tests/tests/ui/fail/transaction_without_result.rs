use axum::http::StatusCode;
use idempotent_runtime::{Postgres, Tx, idempotent};

#[idempotent(scope = caller)]
async fn deposit(caller: String, tx: &mut Tx<Postgres>) -> StatusCode {
    let _ = (caller, tx);
    StatusCode::CREATED
}

fn main() {
    let _ = deposit;
}
