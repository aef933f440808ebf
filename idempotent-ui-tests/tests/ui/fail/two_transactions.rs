use axum::http::StatusCode;
use idempotent_runtime::{Sqlite, Tx, idempotent};

#[idempotent(scope = caller)]
async fn transfer(
    caller: String,
    from: &mut Tx<Sqlite>,
    to: &mut Tx<Sqlite>,
) -> Result<StatusCode, StatusCode> {
    let _ = (caller, from, to);
    Ok(StatusCode::CREATED)
}

fn main() {
    let _ = transfer;
}
