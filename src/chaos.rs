//! The chaos check of the payments demo (`cargo run --example chaos`, and a short run in
//! the end-to-end tests): demo instances on one Postgres, a fault-injecting proxy in front
//! of each, retrying clients, and the count of handler executions per payment from the
//! demo's own records.

pub mod client;
pub use crate::fault_proxy as proxy;
pub mod run;
