//! The runtime's tests that need a `main` of their own, in one binary so the dependency
//! tree is linked once: the conformance suite and each store's own tests, the
//! transactional unit of work, waiting, transaction failures and the exact metrics. They
//! run through libtest-mimic (`idempotent_runtime::testing`), so a store whose server is
//! not configured shows its tests as ignored, never passed.
//!
//! Each module's trials carry the module's name as their kind, shown and matched as
//! `[store_sqlite] conformance::check_…`, so the stores' same-named checks stay apart
//! and `cargo test --test stores store_sqlite` runs one module.

#[cfg(feature = "nats")]
mod door_nats;
#[cfg(feature = "rabbitmq")]
mod door_rabbitmq;
mod fenced_btree_store;
#[cfg(any(feature = "mysql", feature = "postgres", feature = "redis"))]
mod fixtures;
mod metrics_counters;
mod out_of_tree_store;
mod store_memory;
#[cfg(feature = "mysql")]
mod store_mysql;
#[cfg(feature = "postgres")]
mod store_postgres;
#[cfg(feature = "redis")]
mod store_redis;
#[cfg(feature = "redis")]
mod store_redis_cluster;
#[cfg(feature = "sqlite")]
mod store_sqlite;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod transaction;
#[cfg(all(feature = "sqlite", feature = "postgres"))]
mod transaction_failures;
#[cfg(feature = "sqlite")]
mod waiting;

use idempotent_runtime::testing::Trial;

fn main() {
    // The SQLite clock-step test runs this binary again as the process that retries.
    #[cfg(feature = "sqlite")]
    if let Ok(path) = std::env::var(store_sqlite::leases::CHILD_CLAIM) {
        return store_sqlite::leases::child_claim(&path);
    }
    let mut trials = Vec::new();
    let mut add = |kind: &str, module: Vec<Trial>| {
        trials.extend(module.into_iter().map(|trial| trial.with_kind(kind)));
    };
    add("store_memory", store_memory::trials());
    #[cfg(feature = "sqlite")]
    add("store_sqlite", store_sqlite::trials());
    #[cfg(feature = "postgres")]
    add("store_postgres", store_postgres::trials());
    #[cfg(feature = "mysql")]
    add("store_mysql", store_mysql::trials());
    #[cfg(feature = "redis")]
    add("store_redis", store_redis::trials());
    #[cfg(feature = "redis")]
    add("store_redis_cluster", store_redis_cluster::trials());
    add("out_of_tree_store", out_of_tree_store::trials());
    add("fenced_btree_store", fenced_btree_store::trials());
    #[cfg(all(feature = "sqlite", feature = "postgres"))]
    add("transaction_failures", transaction_failures::trials());
    #[cfg(feature = "sqlite")]
    add("waiting", waiting::trials());
    add("metrics_counters", metrics_counters::trials());
    #[cfg(feature = "nats")]
    add("door_nats", door_nats::trials());
    #[cfg(feature = "rabbitmq")]
    add("door_rabbitmq", door_rabbitmq::trials());
    idempotent_runtime::testing::run(trials)
}
