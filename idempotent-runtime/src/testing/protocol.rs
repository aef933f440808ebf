//! The protocol's rules as the pure functions the stores and the engine call, for a model
//! checker (this workspace's `idempotent-model` checks them with `stateright`) and for a
//! store outside this crate that wants to decide claims exactly as the stores here do.
//!
//! Each is the one copy of its rule: the stores' claims classify a found record with
//! [`decide`] (of which [`takeover`] is the first step), the engine runs a claim, raises
//! `lease_lost` and times its renewals by [`licence_holds`] and [`renewal_timeout`], and
//! stops recording an answer only when [`may_stop_recording`] says so. [`rules`] holds
//! the decisions [`Fenced`](crate::fenced::Fenced) takes about one record over the fenced
//! record seam (claims, ownership, which steps a takeover keeps, release, expiry,
//! `forget`, `inspect`).

pub use crate::fenced::rules::{self, Decision, Found, decide, steps_survive, takeover};
pub use crate::lease::{licence_holds, may_stop_recording, renewal_timeout};
