//! # idempotent-runtime
//!
//! Makes payment-style HTTP APIs safe to retry. A client names an operation once with an
//! `Idempotency-Key` header and reuses the key on every retry; the server runs the
//! handler once and replays what it answered. Two duplicates that arrive together never
//! both run: one claims the key atomically in a shared store, the other gets `409`.
//!
//! Users depend on this crate only; the attribute macro is re-exported as [`idempotent`].
//! (The crates are `idempotent-runtime` and `idempotent-macros` because `idempotent` on
//! crates.io is an unrelated crate.) Minimum supported Rust version: **1.95**.
//!
//! **[The guide](guide)** is the reference for using it: [start your own
//! app](guide::app), [the contract](guide::contract), [the published
//! policy](guide::policy), [the attribute](guide::attribute), [the tower
//! layer](guide::layer), [stores](guide::stores), [transactional
//! handlers](guide::transactions), and more.
//!
//! # A complete app
//!
//! An engine ([`Idempotency`]) over a store, in the router state (found through
//! `FromRef`), an authenticated caller type that implements [`Scope`], and a handler
//! marked `#[idempotent]`:
//!
//! ```no_run
//! use std::borrow::Cow;
//! use std::time::Duration;
//!
//! use axum::extract::{FromRef, FromRequestParts, State};
//! use axum::http::{StatusCode, request::Parts};
//! use axum::routing::post;
//! use axum::{Json, Router};
//! use idempotent_runtime::store::SqliteStore;
//! use idempotent_runtime::{Idempotency, IdempotencyKey, Scope, idempotent};
//! use serde::Deserialize;
//!
//! /// The router state: the engine, plus whatever else the app needs.
//! #[derive(Clone)]
//! struct AppState {
//!     idempotency: Idempotency,
//! }
//!
//! // How `#[idempotent]` handlers find the engine.
//! impl FromRef<AppState> for Idempotency {
//!     fn from_ref(state: &AppState) -> Self {
//!         state.idempotency.clone()
//!     }
//! }
//!
//! /// The authenticated caller: keys are unique per caller, never global.
//! struct Caller {
//!     account: String,
//! }
//!
//! impl Scope for Caller {
//!     fn scope(&self) -> Cow<'_, str> {
//!         Cow::Borrowed(&self.account)
//!     }
//! }
//!
//! impl<S: Send + Sync> FromRequestParts<S> for Caller {
//!     type Rejection = StatusCode;
//!
//!     async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, StatusCode> {
//!         // Your authentication here; never a header the client picks freely.
//!         let token = parts.headers.get("authorization").and_then(|v| v.to_str().ok());
//!         match token.and_then(|t| t.strip_prefix("Bearer sk_")) {
//!             Some(account) => Ok(Caller { account: account.to_owned() }),
//!             None => Err(StatusCode::UNAUTHORIZED),
//!         }
//!     }
//! }
//!
//! #[derive(Deserialize)]
//! struct NewOrder {
//!     amount: u64,
//! }
//!
//! #[idempotent(scope = caller, ttl = "24h")]
//! async fn create_order(
//!     caller: Caller,
//!     key: IdempotencyKey,
//!     State(_state): State<AppState>,
//!     Json(order): Json<NewOrder>,
//! ) -> Result<(StatusCode, Json<serde_json::Value>), StatusCode> {
//!     // Runs once per (caller, key); a retry gets this answer replayed. Send
//!     // `key.derive("charge")` to a payment provider so it deduplicates too.
//!     let id = format!("ord_{}", &key.derive("order")[5..17]);
//!     let body = serde_json::json!({ "id": id, "amount": order.amount, "owner": caller.account });
//!     Ok((StatusCode::CREATED, Json(body)))
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // The engine's log events (claimed, replayed, …) on stderr; needs `tracing-subscriber`.
//!     tracing_subscriber::fmt::init();
//!     // SQLite for one host; `PostgresStore::connect(url)` (feature `postgres`) for many.
//!     let store = SqliteStore::connect("sqlite://orders.db").await?;
//!     let idempotency = Idempotency::builder(store)
//!         .default_lease(Duration::from_secs(30))
//!         .build();
//!     let _sweeper = idempotency.spawn_sweeper(Duration::from_secs(3600));
//!
//!     let state = AppState { idempotency: idempotency.clone() };
//!     let app = Router::new().route("/orders", post(create_order)).with_state(state);
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     axum::serve(listener, app)
//!         .with_graceful_shutdown(async { tokio::signal::ctrl_c().await.unwrap_or(()) })
//!         .await?;
//!     // Let requests that are still running record their outcome.
//!     idempotency.drain(Duration::from_secs(30)).await;
//!     Ok(())
//! }
//! ```
//!
//! What a client then sees is the contract: a replay carries `Idempotent-Replayed: true`;
//! the same key with another body is `422`; a duplicate of a running request is `409`
//! with `Retry-After`; a missing or malformed key is `400`; a store that cannot be
//! reached is `503` and the handler does not run. Errors are `application/problem+json`
//! ([`Problem`]) with a stable `code` ([`problem::codes`]), or the application's own
//! error envelope ([`IdempotencyBuilder::render_problems`]).
//!
//! # The pieces
//!
//! - [`key`]: the `Idempotency-Key` header (RFC 9651 sf-string or bare token) and the
//!   claimed [`IdempotencyKey`] with its derived downstream keys;
//! - [`scope`]: the [`Scope`] of a key, the authenticated caller;
//! - [`fingerprint`]: SHA-256 over method, path, query and raw body (or canonical JSON);
//! - [`store`]: the [`Store`] trait and its implementations;
//! - [`engine`]: [`Idempotency`], the claim → execute → record loop, duplicates that
//!   wait for the running original ([`HandlerConfig::wait`]), the replay cache
//!   ([`IdempotencyBuilder::replay_cache`]), and the operator tools
//!   [`Idempotency::inspect`] and [`Idempotency::forget`];
//! - [`layer`]: [`IdempotencyLayer`], the same contract as a tower layer, for routes
//!   protected without the macro;
//! - [`transaction`]: handlers whose writes commit together with the stored response
//!   (`tx: &mut Tx<Sqlite>` / `Tx<Postgres>`);
//! - [`problem`]: RFC 9457 `application/problem+json` error responses;
//! - `openapi` (feature `utoipa`): the published policy, written into an OpenAPI
//!   document;
//! - [`rejection`]: [`AsProblem`], which answers an extractor's rejection (bad JSON, …)
//!   as problem+json too;
//! - [`metrics`]: the counters and histograms the engine records through the `metrics`
//!   facade (names, labels, outcomes);
//!
//! # Feature flags
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `sqlite` | yes | `store::SqliteStore` (one host, embedded), `Tx<Sqlite>` |
//! | `postgres` | no | `store::PostgresStore` (many instances, one database), `Tx<Postgres>` |
//! | `redis` | no | `store::RedisStore` (many instances, one Redis/Valkey; see its durability notes) |
//! | `mysql` | no | `store::MySqlStore` (many instances, one MySQL 8 / MariaDB 10.6+ database), `Tx<MySql>` |
//! | `testing` | no | `testing::conformance`: the store conformance suite, for a `Store` of your own |
//! | `utoipa` | no | `openapi::PublishedPolicy`: the idempotency policy of your operations in a `utoipa` OpenAPI document; `Problem` as a `utoipa::ToSchema` |
//!
//! `Sqlite`, `Postgres` and `MySql` are re-exported from `sqlx` so transactional handlers
//! can name `Tx<Sqlite>` without a direct `sqlx` dependency.
//!
//! [`store::MemoryStore`] (one process; tests and demos) is always there. Build without
//! SQLite with `default-features = false, features = ["postgres"]`. A seventh feature,
//! `sql`, is what the SQL stores share; each of their features enables it.
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod clock;
pub mod config;
#[cfg(any(feature = "nats", feature = "rabbitmq"))]
pub mod doors;
pub mod engine;
pub mod fenced;
pub mod fingerprint;
pub mod guide;
pub mod key;
pub mod layer;
mod lease;
// Private: the expansion names `Guard` and `Hashed` only through `__private`.
mod macro_support;
pub mod metrics;
#[cfg(feature = "utoipa")]
pub mod openapi;
pub mod problem;
pub mod rejection;
mod rendering;
mod request;
pub mod scope;
mod sharded;
pub mod steps;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "sql")]
pub mod transaction;
#[cfg(feature = "webhooks")]
pub mod webhook;

// The root holds what an application names; what only a store's author (or a test of
// the engine) needs stays in its module: `store::`, `fenced::`, `clock::`, `fingerprint::`, `key::`.
pub use config::{HandlerConfig, OnServerError};
pub use engine::{Idempotency, IdempotencyBuilder, Outcome};
pub use fingerprint::{Fingerprint, FingerprintMode};
// The attribute's examples are on this re-export, not on the macro: here they compile
// against the runtime this crate's tests build anyway, where a proc-macro's dev-dependency
// on it would be built a second time, with features of its own. Rustdoc shows them first.
/// Makes an Axum handler, or a consumer function, run once per idempotency key: an
/// example of each first, then the reference.
///
/// # Examples
///
/// A handler: the first request with a key runs it, a retry with the same key and the same
/// request gets the recorded answer.
///
/// ```
/// # use std::borrow::Cow;
/// # use axum::extract::{FromRef, FromRequestParts, State};
/// # use axum::http::{StatusCode, request::Parts};
/// # use axum::{Json, Router, routing::post};
/// use idempotent_runtime::{Idempotency, IdempotencyKey, Scope, idempotent};
/// # #[derive(Clone)]
/// # struct AppState { idempotency: Idempotency }
/// # impl FromRef<AppState> for Idempotency {
/// #     fn from_ref(state: &AppState) -> Self { state.idempotency.clone() }
/// # }
/// # struct Caller(String);
/// # impl<S: Send + Sync> FromRequestParts<S> for Caller {
/// #     type Rejection = StatusCode;
/// #     async fn from_request_parts(_: &mut Parts, _: &S) -> Result<Self, StatusCode> {
/// #         Ok(Caller("acct_alice".into()))
/// #     }
/// # }
/// impl Scope for Caller {
///     fn scope(&self) -> Cow<'_, str> {
///         Cow::Borrowed(&self.0)
///     }
/// }
///
/// #[idempotent(scope = caller, ttl = "24h")]
/// async fn create_payment(
///     caller: Caller,                  // authenticated; implements `Scope`
///     key: IdempotencyKey,             // only if needed: the claimed key, for downstream keys
///     State(app): State<AppState>,
///     Json(amount): Json<u64>,
/// ) -> Result<(StatusCode, Json<String>), StatusCode> {
///     let downstream_key = key.derive("charge"); // send this to the payment provider
///     let _ = (caller, app, amount);
///     Ok((StatusCode::CREATED, Json(downstream_key)))
/// }
///
/// # let state = AppState { idempotency: Idempotency::new(idempotent_runtime::store::MemoryStore::new()) };
/// let app: Router = Router::new().route("/payments", post(create_payment)).with_state(state);
/// ```
///
/// A consumer function (a key expression): each call with the same message id after the
/// first gets the recorded outcome, [`Outcome::Replayed`].
///
/// ```
/// use idempotent_runtime::store::MemoryStore;
/// use idempotent_runtime::{Idempotency, IdempotencyKey, Outcome, idempotent};
///
/// #[derive(serde::Serialize)]
/// struct Order {
///     id: String,
///     cents: u64,
/// }
///
/// #[idempotent(key = order.id, scope = "orders", ttl = "7d")]
/// async fn charge(idempotency: &Idempotency, order: Order, key: IdempotencyKey) -> Result<u64, String> {
///     let _provider_key = key.derive("gateway"); // the same on every run of this order
///     Ok(order.cents)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let idempotency = Idempotency::new(MemoryStore::new());
/// let order = || Order { id: "o_1".into(), cents: 1999 };
/// assert!(matches!(charge(&idempotency, order()).await, Outcome::Ran(1999)));
/// assert!(matches!(charge(&idempotency, order()).await, Outcome::Replayed(1999)));
/// # }
/// ```
#[doc(inline)]
pub use idempotent_macros::idempotent;
// The attribute's duration grammar, for durations an application reads at run time
// (flags, environment variables), so that both accept the same text.
pub use idempotent_policy::duration;
pub use key::IdempotencyKey;
pub use layer::IdempotencyLayer;
pub use problem::Problem;
pub use rejection::AsProblem;
pub use scope::Scope;
#[cfg(feature = "mysql")]
pub use sqlx::MySql;
#[cfg(feature = "postgres")]
pub use sqlx::Postgres;
#[cfg(feature = "sqlite")]
pub use sqlx::Sqlite;
pub use steps::StepError;
pub use store::{ForgetOutcome, RecordInfo, RecordState, Store, StoreError};
#[cfg(feature = "sql")]
pub use transaction::Tx;

/// Not public API: exactly the paths the `#[idempotent]` expansion names (so users depend
/// on this crate alone). Changes here follow the macro crate, never semver of this crate.
#[doc(hidden)]
pub mod __private {
    pub use crate::config::{HandlerConfig, OnServerError};
    pub use crate::engine::Outcome;
    pub use crate::fingerprint::FingerprintMode;
    #[cfg(feature = "sql")]
    pub use crate::macro_support::once_in_transaction;
    pub use crate::macro_support::{
        Engine, Guard, Hashed, KeyText, Payload, RecordedOutput, ScopeText, StateGivesEngine,
        ViaHashed, check_state_gives_engine, once,
    };
    pub use crate::scope::Scope;
    pub use axum::response::Response;
    pub use std::time::Duration;
}
