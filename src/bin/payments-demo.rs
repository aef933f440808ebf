//! The payments demo as a binary target, so multi-process tests can start it through
//! `CARGO_BIN_EXE_payments-demo`. Same program as `cargo run --example payments`.

use std::process::ExitCode;

use idempotent_demo::{payments, serve};

#[tokio::main]
async fn main() -> ExitCode {
    let args = serve::start();
    serve::exit_code(payments::run(args).await)
}
