//! The payments demo: `cargo run --example payments` (see `-- --help` for the flags). The
//! app itself (its `#[idempotent]` handler, state, engine wiring and router) is
//! `idempotent_demo::payments`, in `src/payments.rs`.

use std::process::ExitCode;

use idempotent_demo::{payments, serve};

#[tokio::main]
async fn main() -> ExitCode {
    let args = serve::start();
    serve::exit_code(payments::run(args).await)
}
