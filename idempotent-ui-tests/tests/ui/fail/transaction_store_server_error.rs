use axum::http::StatusCode;
use idempotent_runtime::{Postgres, Tx, idempotent};

#[idempotent(scope = caller, on_server_error = store)]
async fn deposit(caller: String, tx: &mut Tx<Postgres>) -> Result<StatusCode, StatusCode> {
    let _ = (caller, tx);
    Ok(StatusCode::CREATED)
}

fn main() {
    // The function is still emitted next to the error.
    let _ = deposit;
}
