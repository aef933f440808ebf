//! The chaos check (`idempotent_demo::chaos`), short: three payments demo processes on one
//! Postgres, a fault proxy in front of each, retrying clients; every answered payment
//! ran its handler exactly once and none ran twice, counted from the gateway's call log.
//! The full run is `cargo run --release --example chaos` (see the guide's chapter
//! `idempotent_runtime::guide::checks`).
//!
//! Needs `IDEMPOTENT_TEST_POSTGRES_URL` (reported ignored without it); the run creates
//! and drops its own database.

use std::process::Command;
use std::time::Duration;

use idempotent_demo::chaos::{client, proxy, run};
use idempotent_runtime::testing::{Trial, async_trial, ignored_if};

const DEMO: &str = env!("CARGO_BIN_EXE_payments-demo");

const URL_VAR: &str = "IDEMPOTENT_TEST_POSTGRES_URL";

pub(crate) fn trials() -> Vec<Trial> {
    let unavailable = match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => None,
        _ => Some(format!(
            "{URL_VAR} is not set (e.g. postgres://postgres@127.0.0.1:5432/test)"
        )),
    };
    let trials = vec![async_trial(
        "faults_between_clients_and_instances_never_run_a_payment_twice",
        faults_between_clients_and_instances_never_run_a_payment_twice,
    )];
    ignored_if(unavailable, trials)
}

async fn faults_between_clients_and_instances_never_run_a_payment_twice() {
    let admin_url = std::env::var(URL_VAR).expect("checked in `trials`");
    let attempt_timeout = Duration::from_millis(800);
    let config = run::ChaosConfig {
        admin_url,
        instances: 3,
        payments: 30,
        concurrency: 10,
        gateway_latency: Duration::from_millis(50),
        rates: proxy::FaultRates {
            dropped: 12,
            cut_in_flight: 12,
            answer_lost: 12,
            stalled: 6,
            stall: attempt_timeout + Duration::from_millis(300),
        },
        policy: client::RetryPolicy {
            attempt_timeout,
            // Sized for the liveness check below. With these rates an attempt fails
            // (an injected fault, or a `409` right after a cut one) with probability
            // about 0.46, measured over 105 runs; so a payment goes unanswered after n
            // attempts with about 0.46^n, and some payment of 30 in a run with about
            // 30 × 0.46^n: 1.3% at n = 10 (what this test once used, and how it failed
            // now and then), 6e-6 at n = 20.
            max_attempts: 20,
            base_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(500),
            max_retry_after: Duration::from_secs(1),
        },
        // A run takes 4-6 s; the limit only bounds a payment that needs many attempts.
        time_limit: Duration::from_secs(60),
        log_dir: std::env::temp_dir().join("idempotent-chaos-test"),
    };
    let report = run::run(config, &|| Command::new(DEMO))
        .await
        .expect("the chaos run completes");
    println!("{report}");
    assert!(report.passed(), "{report}");
    let faults = report.dropped + report.cut_in_flight + report.answer_lost + report.stalled;
    assert!(faults > 0, "no fault was injected: {report}");
    assert_eq!(report.executions.len(), 30);
    // Every attempt the client saw fail was failed by the proxy: no request that reached
    // an instance went unanswered within the client's timeout.
    let transport_errors: u32 = report.outcomes.iter().map(|o| o.transport_errors).sum();
    assert_eq!(u64::from(transport_errors), faults, "{report}");
    // The retries got through: with twenty attempts each, every payment has its answer.
    let answered = report
        .outcomes
        .iter()
        .filter(|o| o.status.is_some())
        .count();
    assert_eq!(answered, 30, "{report}");
}
