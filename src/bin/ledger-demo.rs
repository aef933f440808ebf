//! The ledger demo as a binary target, so crash tests can start (and lose) it through
//! `CARGO_BIN_EXE_ledger-demo`. A `postgres://` or `mysql://` URL runs the ledger's twin
//! for that database, so the crash tests cover every SQL database.

use std::process::ExitCode;

use idempotent_demo::{ledger, serve};

#[tokio::main]
async fn main() -> ExitCode {
    let args = serve::start();
    #[cfg(feature = "postgres")]
    if args.database_url.starts_with("postgres:") || args.database_url.starts_with("postgresql:") {
        return serve::exit_code(ledger::postgres::run(args).await);
    }
    #[cfg(feature = "mysql")]
    if args.database_url.starts_with("mysql:") {
        return serve::exit_code(ledger::mysql::run(args).await);
    }
    serve::exit_code(ledger::run(args).await)
}
