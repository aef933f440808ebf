//! The ledger example as a binary target, so crash tests can start (and lose) it through
//! `CARGO_BIN_EXE_ledger-demo`. The example file itself is compiled in; a `postgres://`
//! or `mysql://` URL runs its twin for that database (`tests/support/ledger_*.rs`), so
//! the crash tests cover every SQL database.

#[allow(dead_code, unreachable_pub)] // items the twins and the tests reuse
#[path = "../../examples/ledger.rs"]
mod ledger;

#[cfg(feature = "postgres")]
#[allow(dead_code, unreachable_pub)]
#[path = "../../tests/support/ledger_postgres.rs"]
mod ledger_postgres;

#[cfg(feature = "mysql")]
#[allow(dead_code, unreachable_pub)]
#[path = "../../tests/support/ledger_mysql.rs"]
mod ledger_mysql;

use idempotent_demo::serve;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = serve::start();
    #[cfg(feature = "postgres")]
    if args.database_url.starts_with("postgres:") || args.database_url.starts_with("postgresql:") {
        return serve::exit_code(ledger_postgres::run(args).await);
    }
    #[cfg(feature = "mysql")]
    if args.database_url.starts_with("mysql:") {
        return serve::exit_code(ledger_mysql::run(args).await);
    }
    serve::exit_code(ledger::run(args).await)
}
