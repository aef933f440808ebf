//! Starting a demo: open the database, build the engine, print how to call it, serve
//! until Ctrl-C. Shared by the example binaries and the `*-demo` binaries the
//! multi-process tests start.

use std::time::Duration;

use axum::Router;
use idempotent_runtime::Idempotency;

use crate::auth::DEMO_KEYS;
use crate::cli::DemoArgs;
use crate::database::{self, Database};
use crate::gateway::Gateway;
use crate::{ledger, payments};

/// Which demo to serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Demo {
    /// `examples/payments.rs`.
    Payments,
    /// `examples/ledger.rs`.
    Ledger,
}

/// Runs `demo` with `args` until Ctrl-C (or SIGTERM).
pub async fn serve(demo: Demo, args: DemoArgs) -> Result<(), Box<dyn std::error::Error>> {
    if args.lease >= args.ttl {
        return Err(format!(
            "--lease ({:?}) must be shorter than --ttl ({:?})",
            args.lease, args.ttl
        )
        .into());
    }
    let (db, store) = database::open(&args.database_url).await?;
    let idempotency = Idempotency::builder_shared(store)
        .default_lease(args.lease)
        .default_ttl(args.ttl)
        .build();
    let _sweeper = idempotency.spawn_sweeper(Duration::from_secs(60));
    let app = build(demo, db, idempotency.clone(), &args).await?;

    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    let addr = listener.local_addr()?;
    print_banner(demo, addr, &args);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    // Let detached handlers finish and record their outcomes before the runtime stops.
    if !idempotency.drain(Duration::from_secs(30)).await {
        eprintln!("shutdown: some requests were still running after 30s");
    }
    Ok(())
}

async fn build(
    demo: Demo,
    db: Database,
    idempotency: Idempotency,
    args: &DemoArgs,
) -> Result<Router, Box<dyn std::error::Error>> {
    Ok(match demo {
        Demo::Payments => {
            let gateway = Gateway::new(db, args.gateway_latency()).await?;
            payments::router(payments::AppState {
                idempotency,
                gateway,
            })
        }
        Demo::Ledger => {
            ledger::migrate(&db).await?;
            ledger::router(ledger::LedgerState { idempotency, db })
        }
    })
}

fn print_banner(demo: Demo, addr: std::net::SocketAddr, args: &DemoArgs) {
    let (name, path, body) = match demo {
        Demo::Payments => (
            "payments",
            "payments",
            r#"{"amount": 10000, "currency": "BRL"}"#,
        ),
        Demo::Ledger => ("ledger", "deposits", r#"{"amount": 500}"#),
    };
    println!("{name} demo listening on http://{addr}");
    println!("database: {}", redact(&args.database_url));
    println!("idempotency: ttl {:?}, lease {:?}", args.ttl, args.lease);
    for (key, account) in DEMO_KEYS {
        println!("  api key {key} -> {account}");
    }
    println!("\ntry (twice: the second answer is replayed with Idempotent-Replayed: true):");
    println!(
        "  curl -i -X POST http://{addr}/{path} -H 'Authorization: Bearer sk_test_alice' \\\n    -H 'Idempotency-Key: order-1042' -H 'Content-Type: application/json' -d '{body}'"
    );
    let list = if demo == Demo::Payments {
        "payments"
    } else {
        "balance"
    };
    println!("  curl -s http://{addr}/{list} -H 'Authorization: Bearer sk_test_alice'\n");
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

/// `url` with any password replaced by `***`.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            match url[scheme_end + 3..at].split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// The `main` of every demo binary: logs to stderr, parses flags, serves, and turns a
/// startup error into a message and exit code 1.
pub fn main(demo: Demo) -> std::process::ExitCode {
    use clap::Parser;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = DemoArgs::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(demo, args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn redacts_passwords_only() {
        assert_eq!(
            super::redact("postgres://app:s3cret@db:5432/pay"),
            "postgres://app:***@db:5432/pay"
        );
        assert_eq!(
            super::redact("postgres://app@db/pay"),
            "postgres://app@db/pay"
        );
        assert_eq!(
            super::redact("sqlite://payments.db"),
            "sqlite://payments.db"
        );
    }
}
