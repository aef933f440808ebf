use axum::http::StatusCode;
use idempotent_runtime::{Postgres, Tx, idempotent};

#[idempotent(scope = caller)]
async fn transfer(
    caller: String,
    from: &mut Tx<Postgres>,
    to: &mut Tx<Postgres>,
) -> Result<StatusCode, StatusCode> {
    let _ = (caller, from, to);
    Ok(StatusCode::CREATED)
}

fn main() {
    let _ = transfer;
}
