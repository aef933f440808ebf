//! The store's server-side scripts, each the shared prelude plus its own body: they
//! insert, read, compare-and-set and delete one record, and decide nothing.
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

/// Insert a claimed record unless the key has one; else answer that one.
pub(super) static INSERT: LazyLock<Script> = script!("insert.lua");
/// Answer the record.
pub(super) static READ: LazyLock<Script> = script!("read.lua");
/// Apply a change if the record is at a version; else answer it.
pub(super) static UPDATE: LazyLock<Script> = script!("update.lua");
/// Delete the record if it is at a version.
pub(super) static DELETE: LazyLock<Script> = script!("delete.lua");
