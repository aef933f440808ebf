//! The ledger demo API: `cargo run --example ledger` (see `--help` for the flags).
//!
//! Deposits whose ledger rows commit in one transaction with the stored idempotent
//! response; routes and behaviour: `idempotent_demo::ledger`.

fn main() -> std::process::ExitCode {
    idempotent_demo::serve::main(idempotent_demo::serve::Demo::Ledger)
}
