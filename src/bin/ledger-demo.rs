//! The ledger example as a binary target, so crash tests can start (and lose) it through
//! `CARGO_BIN_EXE_ledger-demo`. The example file itself is compiled in; a `postgres://`
//! URL runs its Postgres twin (`tests/support/ledger_postgres.rs`), so the crash tests
//! cover both databases.

#[allow(dead_code, unreachable_pub)] // items the Postgres twin and the tests reuse
#[path = "../../examples/ledger.rs"]
mod ledger;

#[cfg(feature = "postgres")]
#[allow(dead_code, unreachable_pub)]
#[path = "../../tests/support/ledger_postgres.rs"]
mod ledger_postgres;

use idempotent_demo::serve;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = serve::start();
    #[cfg(feature = "postgres")]
    if args.database_url.starts_with("postgres:") || args.database_url.starts_with("postgresql:") {
        return serve::exit_code(ledger_postgres::run(args).await);
    }
    serve::exit_code(ledger::run(args).await)
}
