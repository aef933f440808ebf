//! Support for the demo applications in `examples/`: the plumbing both demos share, so
//! each example file shows only what a user of `idempotent` writes (its handlers, its
//! state and engine wiring, its router).
//!
//! - [`auth`]: bearer-token authentication with fixed demo API keys (the idempotency
//!   scope);
//! - [`cli`]: the flags, each with an environment fallback;
//! - [`database`]: SQLite or Postgres, chosen by URL, shared by the store and the demo;
//! - [`gateway`]: a fake payment provider that deduplicates on the key it is sent;
//! - [`prometheus`]: `GET /metrics`, the engine's metrics in the Prometheus text format;
//! - [`serve`]: logging, the serve loop and a graceful shutdown that drains the engine.
//!
//! The example files are also compiled into the `*-demo` binaries and the end-to-end
//! tests (`#[path = "../examples/payments.rs"] mod payments;`), so the tests drive the
//! very handlers a reader sees.

pub mod auth;
pub mod cli;
pub mod database;
pub mod gateway;
pub mod prometheus;
pub mod serve;

/// The README's Rust blocks, compiled as doc tests (`cargo test --doc -p idempotent-demo`)
/// so the "Start your own app" recipe cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
