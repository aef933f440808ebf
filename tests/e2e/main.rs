//! The end-to-end tests of the demo apps, in one binary so the dependency tree is linked
//! once: the HTTP contract on both protections, the payments and ledger demos in-process
//! and as real processes, several instances on one database, outages, recovery points under
//! `kill -9`, the charge consumer on NATS and RabbitMQ, the chaos check, the client half
//! through a fault proxy and the published OpenAPI document under a fuzzer (schemathesis).
//! They run through libtest-mimic (`idempotent_runtime::testing`), so a test whose server
//! is not configured shows as ignored, never passed.
//!
//! Each module's trials carry the module's name as their kind, shown and matched as
//! `[ledger] postgres::…`, so `cargo test --test e2e ledger` runs one module.

#[cfg(feature = "postgres")]
mod chaos;
mod client;
#[cfg(any(feature = "nats", feature = "rabbitmq"))]
mod consumers;
mod contract;
mod http_payments;
mod ledger;
mod metrics_endpoint;
mod multi_instance;
mod openapi;
#[cfg(feature = "postgres")]
mod postgres_outage;
mod recovery_points;
mod schemathesis;
mod support;

use idempotent_runtime::testing::Trial;

fn main() {
    let mut trials = Vec::new();
    let mut add = |kind: &str, module: Vec<Trial>| {
        trials.extend(module.into_iter().map(|trial| trial.with_kind(kind)));
    };
    add("client", client::trials());
    #[cfg(any(feature = "nats", feature = "rabbitmq"))]
    add("consumers", consumers::trials());
    add("contract", contract::trials());
    add("http_payments", http_payments::trials());
    add("ledger", ledger::trials());
    add("metrics_endpoint", metrics_endpoint::trials());
    add("multi_instance", multi_instance::trials());
    add("openapi", openapi::trials());
    add("recovery_points", recovery_points::trials());
    add("schemathesis", schemathesis::trials());
    #[cfg(feature = "postgres")]
    add("postgres_outage", postgres_outage::trials());
    #[cfg(feature = "postgres")]
    add("chaos", chaos::trials());
    idempotent_runtime::testing::run(trials)
}
