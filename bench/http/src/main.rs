//! The benchmark server: serves ONE variant (`--variant NAME`) of the same order handler on
//! `--addr`, with its store empty, until SIGTERM or Ctrl-C. The driver (`../run.sh`) starts
//! one per variant and repetition.
//!
//! Routes: `POST /orders` (the 1 KiB JSON order, `201`), `POST /orders/slow` (the same
//! after 100 ms, for the duplicates test), `GET /stats` (handler executions so far) and,
//! for axum-idempotent, `POST /session` (its session cookie).
//!
//! Exit status: 0 after a clean shutdown, 2 on a bad command line, 3 when the variant's
//! store cannot be reached (the driver then skips the variant).

mod axum_idempotent_app;
mod floor_app;
mod idempotent_app;
mod order;
mod stores;
mod variant;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};

use crate::order::Counters;
use crate::variant::Variant;

/// The command line.
struct Args {
    variant: Variant,
    addr: String,
    data_dir: PathBuf,
}

const USAGE: &str =
    "usage: idempotent-http-bench --variant NAME [--addr 127.0.0.1:38080] [--data-dir DIR]";

fn parse_args() -> Result<Args, String> {
    let mut variant = None;
    let mut addr = "127.0.0.1:38080".to_owned();
    let mut data_dir = std::env::temp_dir();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--variant" => {
                let name = value()?;
                let names: Vec<_> = Variant::ALL.iter().map(|v| v.name()).collect();
                variant = Some(Variant::parse(&name).ok_or(format!(
                    "unknown variant {name}; this server serves {}",
                    names.join(", ")
                ))?);
            }
            "--addr" => addr = value()?,
            "--data-dir" => data_dir = PathBuf::from(value()?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Args {
        variant: variant.ok_or("--variant is required")?,
        addr,
        data_dir,
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let counters = Counters::default();
    let (app, idempotency) = match args.variant {
        Variant::Bare => (bare_router(counters), None),
        Variant::AxumIdempotent => (axum_idempotent_app::router(counters), None),
        Variant::Floor => (floor_app::router(counters), None),
        Variant::FingerprintOnly => (floor_app::fingerprint_router(counters), None),
        Variant::Idempotent(kind) => match stores::open(kind, &args.data_dir).await {
            Ok(store) => {
                let (app, idempotency) = idempotent_app::router(store, counters);
                (app, Some(idempotency))
            }
            Err(stores::Unreachable(reason)) => {
                eprintln!("skipped: {}: store unreachable: {reason}", args.variant);
                return ExitCode::from(3);
            }
        },
    };
    let listener = match tokio::net::TcpListener::bind(&args.addr).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("cannot listen on {}: {e}", args.addr);
            return ExitCode::FAILURE;
        }
    };
    println!("ready: {} on {}", args.variant, args.addr);
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
    {
        eprintln!("server error: {e}");
        return ExitCode::FAILURE;
    }
    if let Some(idempotency) = idempotency {
        idempotency.drain(Duration::from_secs(5)).await;
    }
    ExitCode::SUCCESS
}

/// The handler with no idempotency layer.
fn bare_router(counters: Counters) -> Router {
    Router::new()
        .route("/orders", post(order::create_order))
        .route("/orders/slow", post(order::create_slow_order))
        .route("/stats", get(order::stats))
        .with_state(counters)
}

/// SIGTERM (the driver) or Ctrl-C.
async fn shutdown_signal() {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
