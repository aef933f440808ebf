//! The demo applications and the plumbing they share. The apps show what a user of
//! `idempotent` writes (handlers, state and engine wiring, router); the binaries
//! (`src/bin/`), the examples (`examples/`) and the end-to-end tests all run this code, so
//! the tests drive the very handlers a reader sees.
//!
//! - [`payments`]: the payments API over a fake gateway and a fake mailer, in three steps
//!   (recovery points);
//! - [`ledger`]: a transactional handler (SQLite, with twins for Postgres and MySQL);
//! - `chaos` (feature `postgres`): the chaos check of the payments demo;
//! - [`fault_proxy`]: a TCP proxy that drops requests and cuts answers, for the chaos
//!   check and the client half's tests;
//! - [`auth`]: bearer-token authentication with fixed demo API keys (the idempotency
//!   scope);
//! - [`cli`]: the flags, each with an environment fallback;
//! - [`database`]: SQLite or Postgres, chosen by URL, shared by the store and the demo;
//! - [`gateway`]: a fake payment provider that deduplicates on the key it is sent, and the
//!   effects log the fake providers append to;
//! - [`mailer`]: a fake mailer that sends (and counts) receipts;
//! - [`prometheus`]: `GET /metrics`, the engine's metrics in the Prometheus text format;
//! - [`serve`]: logging, the serve loop and a graceful shutdown that drains the engine.

pub mod amount;
pub mod auth;
#[cfg(feature = "postgres")]
pub mod chaos;
pub mod cli;
pub mod database;
pub mod fault_proxy;
pub mod gateway;
pub mod ledger;
pub mod mailer;
pub mod payments;
pub mod prometheus;
pub mod serve;

/// The README's Rust block, compiled as a doc test (`cargo test --doc -p idempotent-demo`)
/// so its example cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
