//! Starting and stopping a demo: logging and flags ([`start`]), the serve loop with a
//! graceful shutdown that drains the engine ([`serve`]), and the exit code ([`exit_code`]).

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use idempotent_runtime::{Idempotency, duration};

use crate::auth::DEMO_KEYS;
use crate::cli::DemoArgs;
use crate::database::redact_url;

/// Any startup or serving error; printed by [`exit_code`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Installs logging (stderr, `RUST_LOG`, default `info`; colour only on a terminal) and
/// the Prometheus recorder (before any engine is built, so that it sees everything),
/// parses the flags (exiting on a bad one) and logs which database the demo will use.
pub fn start() -> DemoArgs {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Escape codes in a file or a log collector are noise, not colour.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    crate::prometheus::install();
    let args = DemoArgs::from_env();
    tracing::info!(
        database = %redact_url(&args.database_url),
        from = %args.database_url_from,
        "opening the database"
    );
    args
}

/// What the startup banner suggests trying.
#[derive(Debug, Clone, Copy)]
pub struct Banner {
    /// The demo's name, e.g. `payments`.
    pub name: &'static str,
    /// The idempotent route, e.g. `/payments`.
    pub post: &'static str,
    /// A JSON body for it.
    pub body: &'static str,
    /// A route that shows the effect, e.g. `/payments`.
    pub get: &'static str,
}

/// Serves `app`, plus `GET /metrics` ([`prometheus`](crate::prometheus)), on `args.addr`
/// until Ctrl-C or SIGTERM, then waits (up to 30 s) for the
/// handlers `idempotency` still runs, so none is cut off between its side effect and its
/// record.
pub async fn serve(
    app: Router,
    idempotency: &Idempotency,
    args: &DemoArgs,
    banner: Banner,
) -> Result<(), BoxError> {
    let app = app.merge(crate::prometheus::routes());
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    print_banner(banner, listener.local_addr()?, args);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    // Handlers run detached from their connections: let them record their outcomes
    // before the runtime stops.
    if !idempotency.drain(Duration::from_secs(30)).await {
        tracing::warn!("shutdown: some requests were still running after 30s");
    }
    Ok(())
}

/// `SUCCESS`, or `FAILURE` after printing the error (a startup error is a message, not a
/// panic or a `Debug` dump).
pub fn exit_code(result: Result<(), BoxError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

fn print_banner(banner: Banner, addr: std::net::SocketAddr, args: &DemoArgs) {
    let Banner {
        name,
        post,
        body,
        get,
    } = banner;
    println!("{name} demo listening on http://{addr}");
    println!(
        "database: {} (from {})",
        redact_url(&args.database_url),
        args.database_url_from
    );
    let wait = match args.wait {
        Some(wait) => duration::format(wait).to_string(),
        None => "off".to_owned(),
    };
    println!(
        "idempotency: ttl {}, lease {}, wait {wait}",
        duration::format(args.ttl),
        duration::format(args.lease)
    );
    for (key, account) in DEMO_KEYS {
        println!("  api key {key} -> {account}");
    }
    println!("\ntry (twice: the second answer is replayed with Idempotent-Replayed: true):");
    println!(
        "  curl -i -X POST http://{addr}{post} -H 'Authorization: Bearer sk_test_alice' \\\n    -H 'Idempotency-Key: order-1042' -H 'Content-Type: application/json' -d '{body}'"
    );
    println!("  curl -s http://{addr}{get} -H 'Authorization: Bearer sk_test_alice'");
    println!("  curl -s http://{addr}/metrics   # counters and latencies, Prometheus text\n");
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
