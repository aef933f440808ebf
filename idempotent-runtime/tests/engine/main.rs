//! The engine through its public API on the memory store: the request protocol, the
//! typed entry point (`Idempotency::once`) and the replay cache, under the standard test
//! harness (no server involved, so nothing is reported ignored).

mod attribute;
mod engine;
mod error_envelope;
mod function;
mod replay_cache;
mod steps;
mod webhooks;
