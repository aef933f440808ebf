//! # idempotent-runtime
//!
//! The engine behind `#[idempotent]`: it makes payment-style HTTP APIs safe to retry.
//! A client names an operation once with an `Idempotency-Key` header and reuses the key
//! on every retry; the server runs the handler once and replays what it answered.
//!
//! The pieces, one module each:
//!
//! - [`key`]: parsing the `Idempotency-Key` header (RFC 9651 sf-string or bare token);
//! - [`fingerprint`]: SHA-256 over method, path, query and raw body (or canonical JSON);
//! - [`store`]: the [`Store`] trait and its implementations (memory, SQLite, Postgres);
//! - [`engine`]: [`Idempotency`], the claim → execute → record loop;
//! - [`problem`]: RFC 9457 `application/problem+json` error responses;
//! - [`extract`]: the Axum glue the attribute macro expands to.
//!
//! Users depend on this crate only; the attribute macro is re-exported as [`idempotent`].
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod clock;
pub mod config;
pub mod duration;
pub mod engine;
pub mod extract;
pub mod fingerprint;
pub mod key;
pub mod problem;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "sql")]
pub mod transaction;

pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{HandlerConfig, OnServerError};
pub use engine::{Idempotency, IdempotencyBuilder};
pub use extract::{Guard, Hashed, IdempotencyKey, Scope};
pub use fingerprint::{Fingerprint, FingerprintMode};
pub use idempotent_macros::idempotent;
pub use key::KeyError;
pub use problem::Problem;
#[cfg(feature = "postgres")]
pub use sqlx::Postgres;
/// The `sqlx` database types transactional handlers name: `Tx<Sqlite>`, `Tx<Postgres>`.
#[cfg(feature = "sqlite")]
pub use sqlx::Sqlite;
pub use store::{
    ClaimOutcome, ClaimRequest, FencingToken, Store, StoreError, StoredResponse, Takeover,
    TxSupport,
};
#[cfg(feature = "sql")]
pub use transaction::Tx;

/// Not public API: the paths the `#[idempotent]` expansion names. Changes here follow the
/// macro crate, never semver of this crate.
#[doc(hidden)]
pub mod __private {
    pub use crate::config::{HandlerConfig, OnServerError};
    pub use crate::duration::from_secs as duration_from_secs;
    pub use crate::extract::{Guard, Hashed, IdempotencyKey, Scope};
    pub use crate::fingerprint::FingerprintMode;
    #[cfg(feature = "sql")]
    pub use crate::transaction::Tx;
    pub use axum;
    pub use axum::response::Response;
    pub use http;
    pub use std;
}
