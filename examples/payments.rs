//! The payments demo API: `cargo run --example payments` (see `--help` for the flags).
//!
//! Routes and behaviour: `idempotent_demo::payments`.

fn main() -> std::process::ExitCode {
    idempotent_demo::serve::main(idempotent_demo::serve::Demo::Payments)
}
