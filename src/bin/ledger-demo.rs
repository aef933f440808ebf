//! The ledger demo as a binary target, so crash tests can start (and lose) it through
//! `CARGO_BIN_EXE_ledger-demo`. Same as `cargo run --example ledger`.

fn main() -> std::process::ExitCode {
    idempotent_demo::serve::main(idempotent_demo::serve::Demo::Ledger)
}
