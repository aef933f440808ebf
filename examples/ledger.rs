//! The ledger demo on SQLite: `cargo run --example ledger` (see `-- --help` for the
//! flags). The app itself (a transactional `#[idempotent]` handler) is
//! `idempotent_demo::ledger`, in `src/ledger.rs`.

use std::process::ExitCode;

use idempotent_demo::{ledger, serve};

#[tokio::main]
async fn main() -> ExitCode {
    let args = serve::start();
    serve::exit_code(ledger::run(args).await)
}
