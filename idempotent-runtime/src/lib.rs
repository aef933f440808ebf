//! # idempotent-runtime
//!
//! The engine behind `#[idempotent]`: it makes payment-style HTTP APIs safe to retry.
//! A client names an operation once with an `Idempotency-Key` header and reuses the key
//! on every retry; the server runs the handler once and replays what it answered.
//!
//! The pieces, one module each:
//!
//! - [`key`]: the `Idempotency-Key` header (RFC 9651 sf-string or bare token) and the
//!   claimed [`IdempotencyKey`] with its derived downstream keys;
//! - [`scope`]: the [`Scope`] of a key, the authenticated caller;
//! - [`fingerprint`]: SHA-256 over method, path, query and raw body (or canonical JSON);
//! - [`store`]: the [`Store`] trait and its implementations (memory, SQLite, Postgres);
//! - [`engine`]: [`Idempotency`], the claim → execute → record loop;
//! - [`problem`]: RFC 9457 `application/problem+json` error responses;
//! - [`macro_support`]: the Axum extractors the attribute macro expands to (not for
//!   direct use).
//!
//! Users depend on this crate only; the attribute macro is re-exported as [`idempotent`].
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod clock;
pub mod config;
pub mod engine;
pub mod fingerprint;
pub mod key;
pub mod macro_support;
pub mod problem;
pub mod scope;
pub mod store;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub mod transaction;

pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{HandlerConfig, OnServerError};
pub use engine::{Idempotency, IdempotencyBuilder};
pub use fingerprint::{Fingerprint, FingerprintMode};
pub use idempotent_macros::idempotent;
pub use key::{IdempotencyKey, KeyError};
pub use problem::Problem;
pub use scope::Scope;
#[cfg(feature = "postgres")]
pub use sqlx::Postgres;
/// The `sqlx` database types transactional handlers name: `Tx<Sqlite>`, `Tx<Postgres>`.
#[cfg(feature = "sqlite")]
pub use sqlx::Sqlite;
pub use store::{ClaimOutcome, ClaimRequest, FencingToken, Store, StoreError, StoredResponse};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use transaction::Tx;

/// Not public API: exactly the paths the `#[idempotent]` expansion names (so users depend
/// on this crate alone). Changes here follow the macro crate, never semver of this crate.
#[doc(hidden)]
pub mod __private {
    pub use crate::config::{HandlerConfig, OnServerError};
    pub use crate::fingerprint::FingerprintMode;
    pub use crate::macro_support::{Guard, Hashed};
    pub use crate::scope::Scope;
    pub use axum::response::Response;
    pub use std::time::Duration;
}
