//! # The guide
//!
//! How to use `idempotent-runtime`: what a client can rely on, how to wire it into an
//! app, and how to run it in production. Read the first chapter to start; the others are
//! reference, in any order.
//!
//! 1. [`app`]: **start your own app** — dependencies, a complete program, choosing a store;
//! 2. [`demo`]: the demo payments API — every row of the contract with `curl`, and
//!    recipes for a duplicate in flight, expiry and a crashed instance;
//! 3. [`contract`]: what each request gets, the key header, the edge cases, and why the
//!    scope must come from authentication;
//! 4. [`policy`]: the published policy — retention, in-flight duplicates, leases, the
//!    fingerprint, what is stored and replayed;
//! 5. [`attribute`]: every argument of `#[idempotent]`, and what the macro refuses;
//! 6. [`waiting`]: holding a duplicate until the original's answer instead of `409`;
//! 7. [`optional_keys`]: rolling out to clients that do not send keys yet;
//! 8. [`layer`]: [`IdempotencyLayer`](crate::IdempotencyLayer), the same contract without
//!    the macro;
//! 9. [`stores`]: which store to pick, and what each keeps through a crash;
//! 10. [`replay_cache`]: replays answered from memory;
//! 11. [`databases`]: running on Postgres, MySQL/MariaDB or Redis; schema and migrations;
//! 12. [`operator`]: inspecting and forgetting a key;
//! 13. [`transactions`]: business writes that commit together with the stored response;
//! 14. [`metrics`]: counters, histograms and log events;
//! 15. [`openapi`]: the policy in your OpenAPI document;
//! 16. [`checks`]: the test suite, the fuzz harness, the protocol model and the chaos
//!     check — how to run each and what it proves;
//! 17. [`steps`]: multi-step handlers — recovery points, atomic and external steps, and
//!     what a retry does after each kind of failure;
//! 18. [`client`]: calling other APIs safely — `idempotent-client`, one key per call
//!     reused on every retry, and what it retries;
//! 19. [`consumers`]: queue consumers and plain functions — `Idempotency::once`, its
//!     typed outcomes, the transactional inbox, and the NATS JetStream door;
//! 20. [`webhooks`]: incoming webhooks — Standard Webhooks signatures verified before
//!     anything is stored, then one run per event id.
//!
//! Every Rust example here is compiled as a doc test. The examples after [`app`] paste
//! into its program as it stands: what they need from it (the `Caller` extractor, the
//! imports) they repeat in hidden lines.

#[doc = include_str!("01_app.md")]
pub mod app {}

#[doc = include_str!("02_demo.md")]
pub mod demo {}

#[doc = include_str!("03_contract.md")]
pub mod contract {}

#[doc = include_str!("04_policy.md")]
pub mod policy {}

#[doc = include_str!("05_attribute.md")]
pub mod attribute {}

#[doc = include_str!("06_waiting.md")]
pub mod waiting {}

#[doc = include_str!("07_optional_keys.md")]
pub mod optional_keys {}

#[doc = include_str!("08_layer.md")]
pub mod layer {}

#[doc = include_str!("09_stores.md")]
pub mod stores {}

#[doc = include_str!("10_replay_cache.md")]
pub mod replay_cache {}

#[doc = include_str!("11_databases.md")]
pub mod databases {}

#[doc = include_str!("12_operator.md")]
pub mod operator {}

#[doc = include_str!("13_transactions.md")]
pub mod transactions {}

#[doc = include_str!("14_metrics.md")]
pub mod metrics {}

#[doc = include_str!("15_openapi.md")]
pub mod openapi {}

#[doc = include_str!("16_checks.md")]
pub mod checks {}

#[doc = include_str!("17_steps.md")]
pub mod steps {}

#[doc = include_str!("18_client.md")]
pub mod client {}

// The chapter links to the queue doors, which exist with their features only.
#[cfg_attr(
    all(feature = "nats", feature = "rabbitmq"),
    doc = include_str!("19_consumers.md")
)]
#[cfg_attr(
    not(all(feature = "nats", feature = "rabbitmq")),
    doc = "Queue consumers and plain functions. This chapter links to the queue doors: read \
           it in documentation built with the `nats` and `rabbitmq` features (docs.rs has \
           every feature), or as `src/guide/19_consumers.md` in the repository."
)]
pub mod consumers {}

// The chapter links to the webhook verifier, which exists with its feature only.
#[cfg_attr(feature = "webhooks", doc = include_str!("20_webhooks.md"))]
#[cfg_attr(
    not(feature = "webhooks"),
    doc = "Incoming webhooks. This chapter links to the verifier of the `webhooks` \
           feature: read it in documentation built with that feature (docs.rs has every \
           feature), or as `src/guide/20_webhooks.md` in the repository."
)]
pub mod webhooks {}
