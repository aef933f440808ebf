//! The client half of [`idempotent`](https://docs.rs/idempotent-runtime): call other
//! HTTP APIs so that a retry can never do the work twice.
//!
//! A retry policy without an idempotency key is how a card gets charged twice: the
//! answer to a `POST` is lost, the client sends it again, the server runs it again. This
//! crate sends one `Idempotency-Key` per logical call — generated, or given by the caller
//! (inside an `#[idempotent]` handler: `key.derive("charge")`) — and the same key on every
//! retry, so a server that deduplicates on it (Stripe, Adyen, an `idempotent-runtime`
//! app) runs the call once and replays its answer.
//!
//! - [`RetryMiddleware`] for `reqwest-middleware` clients (feature `reqwest`, default);
//! - [`RetryLayer`] for tower services over `http` requests, e.g. a hyper client
//!   (feature `tower`, default);
//! - [`RetryPolicy`]: the rules both apply, written once in [`policy`]: retries on
//!   connection errors and timeouts, `409` (the key is still running), `429`, `502`,
//!   `503` and `504`; `Retry-After` honoured (delta-seconds or HTTP-date, capped), else
//!   exponential backoff with full jitter; an attempt budget and a total deadline; never
//!   a retry of any other answer; never a retry of a request that is neither idempotent by
//!   method nor keyed.
//! - [`CallKey`]: a call's key; [`ResponseExt`]: whether the answer was a replay, and the
//!   call's [`CallReport`].
//!
//! ```
//! use std::time::Duration;
//! use idempotent_client::{CallKey, ResponseExt, RetryMiddleware, RetryPolicy};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = RetryPolicy::default()
//!     .with_max_attempts(5)
//!     .with_deadline(Duration::from_secs(20));
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(RetryMiddleware::new(policy))
//!     .build();
//! let response = client
//!     .post("http://127.0.0.1:3000/payments")
//!     .with_extension(CallKey::generate())
//!     .header("content-type", "application/json")
//!     .body(r#"{"amount": 10000, "currency": "BRL"}"#)
//!     .send()
//!     .await?;
//! let report = response.call_report().expect("sent through the middleware");
//! println!("{} after {} attempts, replayed: {}", response.status(), report.attempts, report.replayed);
//! # Ok(())
//! # }
//! ```
//!
//! The guide's chapter [Calling other APIs safely](https://docs.rs/idempotent-runtime/latest/idempotent_runtime/guide/client/index.html)
//! says when to generate a key and when to derive one.
#![warn(missing_docs)]

mod call;
mod key;
#[cfg(feature = "tower")]
mod layer;
#[cfg(feature = "reqwest")]
mod middleware;
pub mod policy;

pub use call::{CallReport, ClientError, ResponseExt};
pub use key::{CallKey, InvalidKey};
#[cfg(feature = "tower")]
pub use layer::{RetryLayer, RetryService};
#[cfg(feature = "reqwest")]
pub use middleware::RetryMiddleware;
pub use policy::RetryPolicy;
