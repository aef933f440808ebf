//! The compile tests of `#[idempotent]`, in a package of their own: trybuild compiles each
//! case against this package's dependencies, built again in trybuild's own target, so the
//! package depends on what the cases use (the runtime with Postgres, Axum, serde, sqlx,
//! tracing) and nothing else — not the demos' database drivers, HTTP client and CLI.
//!
//! The cases are in `tests/ui/pass` (handlers that must compile, and build a router) and
//! `tests/ui/fail` (mistakes that must be refused, each with the error it gets in a
//! `.stderr` file beside it); `tests/ui.rs` runs them:
//!
//! ```text
//! cargo test -p idempotent-ui-tests
//! TRYBUILD=overwrite cargo test -p idempotent-ui-tests   # then read every changed .stderr
//! ```
//!
//! This library is empty: Cargo needs a target besides the tests.
