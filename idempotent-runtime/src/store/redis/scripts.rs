//! The store's server-side scripts, each the shared prelude plus its own body.
//!
//! [`Script`] runs them with `EVALSHA` and falls back to loading the script when the
//! server does not know it (first use, after a restart or a failover, after
//! `SCRIPT FLUSH`), so the steady state sends the 40-byte hash, not the source.

use std::sync::LazyLock;

use redis::Script;

macro_rules! script {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("scripts/prelude.lua"),
                include_str!(concat!("scripts/", $file))
            ))
        })
    };
}

/// Insert, take over, or report replay / in progress / mismatch.
pub(super) static CLAIM: LazyLock<Script> = script!("claim.lua");
/// Extend the owner's lease (and expiry to at least a TTL from now).
pub(super) static RENEW: LazyLock<Script> = script!("renew.lua");
/// Record the owner's response.
pub(super) static COMPLETE: LazyLock<Script> = script!("complete.lua");
/// Delete the owner's in-progress record, or end its lease when it holds steps.
pub(super) static RELEASE: LazyLock<Script> = script!("release.lua");
/// Append a step to the owner's in-progress record.
pub(super) static RECORD_STEP: LazyLock<Script> = script!("record_step.lua");
/// Delete one record if it is expired.
pub(super) static PURGE: LazyLock<Script> = script!("purge.lua");
/// Describe one live record (operators).
pub(super) static INSPECT: LazyLock<Script> = script!("inspect.lua");
/// Delete one record unless a live lease holds it (or forced); operators.
pub(super) static FORGET: LazyLock<Script> = script!("forget.lua");
