//! The payments example as a binary target, so multi-process tests can start it through
//! `CARGO_BIN_EXE_payments-demo`. Same program as `cargo run --example payments`: the
//! example file itself is compiled in.

#[allow(dead_code, unreachable_pub)] // the example's items, used by its own `main`
#[path = "../../examples/payments.rs"]
mod payments;

fn main() -> std::process::ExitCode {
    payments::main()
}
