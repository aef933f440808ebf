//! The engine through its public API on the memory store: the request protocol and the
//! replay cache, under the standard test harness (no server involved, so nothing is
//! reported ignored).

mod engine;
mod replay_cache;
mod steps;
mod webhooks;
