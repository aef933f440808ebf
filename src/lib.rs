//! Demo applications of the `idempotent` framework, shared by `examples/` (the binaries)
//! and `tests/` (which drive them in-process and as separate processes).
//!
//! - [`payments`]: a payments API whose `POST /payments` charges a fake gateway exactly
//!   once per idempotency key (DESIGN §7);
//! - [`ledger`]: deposits written in one transaction with the stored response (DESIGN §5).

pub mod auth;
pub mod cli;
pub mod database;
pub mod gateway;
pub mod ledger;
pub mod payments;
pub mod serve;
