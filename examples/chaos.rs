//! The chaos check: several payments demo instances on one Postgres, a fault-injecting
//! proxy in front of each, retrying clients, and the count of handler executions per
//! payment from the demo's own records. Exits non-zero if any payment ran twice, or an
//! answered payment did not run exactly once.
//!
//! ```text
//! IDEMPOTENT_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//!   cargo run --release --example chaos -- --payments 300
//! ```
//!
//! Each instance is this program again (`chaos instance …`, serving
//! `idempotent_demo::payments`), a separate OS process with its own engine and connection pool. The run
//! creates its own database and drops it at the end. Everything is on loopback.

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

use clap::Parser;
use idempotent_demo::chaos::{client, proxy, run};
use idempotent_demo::payments;
use idempotent_runtime::duration;

/// Chaos check of the payments demo.
#[derive(Debug, Parser)]
#[command(about)]
struct ChaosArgs {
    /// A Postgres URL whose user may create databases (the run makes and drops its own).
    #[arg(long, env = "IDEMPOTENT_TEST_POSTGRES_URL")]
    postgres_url: String,
    /// Demo instances, each behind its own proxy.
    #[arg(long, default_value_t = 3)]
    instances: usize,
    /// Payments to make.
    #[arg(long, default_value_t = 300)]
    payments: usize,
    /// Payments in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// The fake gateway's latency (how long each handler runs).
    #[arg(long, default_value = "100ms", value_parser = duration::parse)]
    gateway_latency: Duration,
    /// Percent of connections closed before the request reaches the server.
    #[arg(long, default_value_t = 10)]
    drop_percent: u32,
    /// Percent of connections cut after the request reached the server, while it runs.
    #[arg(long, default_value_t = 10)]
    cut_percent: u32,
    /// Percent of connections whose answer is discarded after the server sent it.
    #[arg(long, default_value_t = 10)]
    lose_answer_percent: u32,
    /// Percent of requests held past the client's timeout, then delivered.
    #[arg(long, default_value_t = 5)]
    stall_percent: u32,
    /// The client's timeout per attempt.
    #[arg(long, default_value = "1s", value_parser = duration::parse)]
    attempt_timeout: Duration,
    /// Attempts per payment.
    #[arg(long, default_value_t = 10)]
    max_attempts: u32,
    /// The client phase must end within this.
    #[arg(long, default_value = "5m", value_parser = duration::parse)]
    time_limit: Duration,
    /// Where the instances' logs go.
    #[arg(long, default_value_os_t = std::env::temp_dir().join("idempotent-chaos"))]
    log_dir: PathBuf,
}

fn main() -> ExitCode {
    // `chaos instance --addr … --database-url …`: one demo instance.
    if std::env::args().nth(1).as_deref() == Some("instance") {
        return instance();
    }
    let args = ChaosArgs::parse();
    let percents =
        args.drop_percent + args.cut_percent + args.lose_answer_percent + args.stall_percent;
    if percents > 100 {
        eprintln!("error: the fault percentages add up to {percents}, more than 100");
        return ExitCode::from(2);
    }
    let config = run::ChaosConfig {
        admin_url: args.postgres_url,
        instances: args.instances.max(1),
        payments: args.payments,
        concurrency: args.concurrency.max(1),
        gateway_latency: args.gateway_latency,
        rates: proxy::FaultRates {
            dropped: args.drop_percent,
            cut_in_flight: args.cut_percent,
            answer_lost: args.lose_answer_percent,
            stalled: args.stall_percent,
            stall: args.attempt_timeout + Duration::from_millis(500),
        },
        policy: client::RetryPolicy {
            attempt_timeout: args.attempt_timeout,
            max_attempts: args.max_attempts.max(1),
            base_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            max_retry_after: Duration::from_secs(3),
        },
        time_limit: args.time_limit,
        log_dir: args.log_dir,
    };
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let this = std::env::current_exe().expect("the chaos program's path");
    let instance = move || {
        let mut command = Command::new(&this);
        command.arg("instance");
        command
    };
    match runtime.block_on(run::run(config, &instance)) {
        Ok(report) => {
            println!("{report}");
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Serves the payments demo with the demo's flags (after `instance`).
fn instance() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args = idempotent_demo::cli::DemoArgs::try_from_iter(
        std::iter::once("payments".to_owned()).chain(std::env::args().skip(2)),
    )
    .unwrap_or_else(|err| err.exit());
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    idempotent_demo::serve::exit_code(runtime.block_on(payments::run(args)))
}
