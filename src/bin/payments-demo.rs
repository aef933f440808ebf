//! The payments demo as a binary target, so multi-process tests can start it through
//! `CARGO_BIN_EXE_payments-demo`. Same as `cargo run --example payments`.

fn main() -> std::process::ExitCode {
    idempotent_demo::serve::main(idempotent_demo::serve::Demo::Payments)
}
