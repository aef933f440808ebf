//! The scale benchmark's tool (the driver is `../run.sh`; see `../README.md`). Two
//! commands, one store each (`sqlite`, `postgres` or `mysql`):
//!
//! - `prepare --store S --records N [--expired M]`: empties the store (a new SQLite file,
//!   a new Postgres schema, a new MySQL database), completes one request through the
//!   HTTP benchmark's app to get a record exactly as the store writes it, copies that
//!   record to `N` live records and `M` expired ones in bulk inside the database, checks
//!   that a preloaded key replays, and prints one `result` line: the load time and the
//!   bytes on disk per record (table and indexes).
//! - `serve --store S [--sweep-batch B --sweep-pause-ms P]`: serves the HTTP benchmark's
//!   app (`../http/src/idempotent_app.rs`, the same handler) over the preloaded store
//!   until SIGTERM; with `--sweep-batch`, a sweeper purges the expired backlog meanwhile
//!   and the server logs its throughput.
//! - `drop --store S`: drops what `prepare` created (the file, schema or database).
//!
//! Exit status: 0 on success, 2 on a bad command line, 3 when the store cannot be
//! reached, 1 on any other failure.

#[path = "../../http/src/idempotent_app.rs"]
mod idempotent_app;
// The middleware variants' handlers in it are not served here.
#[allow(dead_code)]
#[path = "../../http/src/order.rs"]
mod order;
mod records;
mod stores;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use idempotent_runtime::engine::REPLAYED_HEADER;
use idempotent_runtime::{Idempotency, Store};
use tower::ServiceExt;

use crate::order::Counters;
use crate::stores::{Backend, StoreKind};

/// What the driver asks for.
enum Command {
    Prepare {
        records: u64,
        expired: u64,
    },
    Serve {
        addr: String,
        sweep: Option<SweepOptions>,
    },
    Drop,
}

/// The sweeper's pace in `serve` (the engine's builder options of the same names).
#[derive(Clone, Copy)]
struct SweepOptions {
    batch: u32,
    pause: Duration,
}

struct Args {
    store: StoreKind,
    data_dir: PathBuf,
    command: Command,
}

const USAGE: &str = "usage: idempotent-scale-bench prepare --store S --records N [--expired M] [--data-dir DIR]\n       \
idempotent-scale-bench drop --store S [--data-dir DIR]\n       \
idempotent-scale-bench serve --store S [--addr 127.0.0.1:28090] [--data-dir DIR] [--sweep-batch B [--sweep-pause-ms P]]\n\
stores: sqlite, postgres, mysql";

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let command = args.next().ok_or("a command is required")?;
    let mut store = None;
    let mut data_dir = std::env::temp_dir();
    let mut records = None;
    let mut expired = 0;
    let mut addr = "127.0.0.1:28090".to_owned();
    let mut sweep_batch = None;
    let mut sweep_pause = Duration::ZERO;
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        let number = |text: String| {
            text.parse::<u64>()
                .map_err(|e| format!("{flag}: {text}: {e}"))
        };
        match flag.as_str() {
            "--store" => {
                let name = value()?;
                store = Some(StoreKind::parse(&name).ok_or(format!("unknown store {name}"))?);
            }
            "--data-dir" => data_dir = PathBuf::from(value()?),
            "--records" => records = Some(number(value()?)?),
            "--expired" => expired = number(value()?)?,
            "--addr" => addr = value()?,
            "--sweep-batch" => {
                let batch = number(value()?)?;
                sweep_batch = Some(u32::try_from(batch).map_err(|e| e.to_string())?);
            }
            "--sweep-pause-ms" => sweep_pause = Duration::from_millis(number(value()?)?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let command = match command.as_str() {
        "prepare" => Command::Prepare {
            records: records.ok_or("--records is required")?.max(1),
            expired,
        },
        "serve" => Command::Serve {
            addr,
            sweep: sweep_batch.map(|batch| SweepOptions {
                batch,
                pause: sweep_pause,
            }),
        },
        "drop" => Command::Drop,
        other => return Err(format!("unknown command {other}")),
    };
    Ok(Args {
        store: store.ok_or("--store is required")?,
        data_dir,
        command,
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
    let outcome = match args.command {
        Command::Prepare { records, expired } => {
            prepare(args.store, &args.data_dir, records, expired).await
        }
        Command::Serve { addr, sweep } => serve(args.store, &args.data_dir, &addr, sweep).await,
        Command::Drop => Backend::drop_all(args.store, &args.data_dir).await,
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Unreachable(reason)) => {
            eprintln!(
                "skipped: {}: store unreachable: {reason}",
                args.store.name()
            );
            ExitCode::from(3)
        }
        Err(Failure::Other(reason)) => {
            eprintln!("error: {}: {reason}", args.store.name());
            ExitCode::FAILURE
        }
    }
}

/// Why a command failed.
pub enum Failure {
    /// The store's server could not be reached: the driver skips the store.
    Unreachable(String),
    /// Anything else.
    Other(String),
}

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Other(e.to_string())
    }
}

/// `prepare`: an empty store, one real record, `records + expired` in all.
async fn prepare(
    kind: StoreKind,
    data_dir: &std::path::Path,
    records: u64,
    expired: u64,
) -> Result<(), Failure> {
    let backend = Backend::reset(kind, data_dir).await?;
    let store = backend.open_store().await?;
    let (app, idempotency) = idempotent_app::router(store, Counters::default());

    // The template: key 0, completed by the app itself.
    let template = records::key(0);
    let response = post_order(&app, &template).await?;
    if response != (StatusCode::CREATED, false) {
        return Err(Failure::Other(format!(
            "the template request answered {response:?}"
        )));
    }
    backend.wait_completed(&template).await?;

    let started = Instant::now();
    backend.bulk_copy(&template, records, expired).await?;
    let load_seconds = started.elapsed().as_secs_f64();

    // A preloaded key, live and not the template, replays without running the handler.
    for i in [records - 1, records / 2] {
        let response = post_order(&app, &records::key(i)).await?;
        if response != (StatusCode::CREATED, true) {
            return Err(Failure::Other(format!(
                "preloaded key {i} answered {response:?} instead of a replay"
            )));
        }
    }
    let runs = handler_runs(&app).await?;
    if runs != 1 {
        return Err(Failure::Other(format!(
            "the handler ran {runs} times; only the template should have"
        )));
    }
    idempotency.drain(Duration::from_secs(5)).await;
    drop(app);

    let size = backend.size().await?;
    let rows = records + expired;
    println!(
        "result store={} records={records} expired={expired} load_seconds={load_seconds:.1} \
         rows={} table_bytes={} index_bytes={} bytes_per_record={:.0} how={}",
        kind.name(),
        size.rows,
        size.table_bytes,
        size.index_bytes,
        (size.table_bytes + size.index_bytes) as f64 / rows as f64,
        size.how,
    );
    Ok(())
}

/// Sends the benchmark's order with `key` through `app`; returns its status and whether
/// it was a replay.
async fn post_order(app: &axum::Router, key: &str) -> Result<(StatusCode, bool), Failure> {
    let request = Request::post("/orders")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {}", records::SCOPE))
        .header("idempotency-key", key)
        .body(Body::from(records::ORDER))?;
    let response = app.clone().oneshot(request).await?;
    Ok((
        response.status(),
        response.headers().contains_key(REPLAYED_HEADER),
    ))
}

/// How many times the order handler ran (`GET /stats`).
async fn handler_runs(app: &axum::Router) -> Result<u64, Failure> {
    let response = app
        .clone()
        .oneshot(Request::get("/stats").body(Body::empty())?)
        .await?;
    let body = axum::body::to_bytes(response.into_body(), 4096).await?;
    let stats: serde_json::Value = serde_json::from_slice(&body)?;
    stats["orders"]
        .as_u64()
        .ok_or_else(|| Failure::Other(format!("GET /stats answered {stats}")))
}

/// `serve`: the HTTP benchmark's app over the preloaded store, and optionally a sweeper.
async fn serve(
    kind: StoreKind,
    data_dir: &std::path::Path,
    addr: &str,
    sweep: Option<SweepOptions>,
) -> Result<(), Failure> {
    let backend = Backend::existing(kind, data_dir).await?;
    let store = backend.open_store().await?;
    // No replay cache: every replay reads the store, whatever the table's size, so the
    // sizes compare the store's cost alone (at 10k records the cache would answer most
    // replays from memory, at 10M almost none).
    let idempotency = Idempotency::builder_shared(store.clone())
        .replay_cache(None)
        .build();
    let app = idempotent_app::router_with(idempotency.clone(), Counters::default());
    let sweeping = match sweep {
        Some(options) => Some(start_sweeping(&backend, store, options).await?),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("ready: {} on {addr}", kind.name());
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    if let Some((sweeper, watcher)) = sweeping {
        sweeper.abort();
        watcher.report_unfinished(&backend).await?;
    }
    idempotency.drain(Duration::from_secs(5)).await;
    Ok(())
}

/// The sweeper over `store` at `options`' pace (an engine of its own, beside the app's:
/// the same store and pool), and a watcher that reports when the backlog is gone.
async fn start_sweeping(
    backend: &Backend,
    store: Arc<dyn Store>,
    options: SweepOptions,
) -> Result<(tokio::task::JoinHandle<()>, Arc<Watcher>), Failure> {
    let backlog = backend.expired_count().await?;
    let sweeper = Idempotency::builder_shared(store)
        .sweep_batch(options.batch)
        .sweep_pause(options.pause)
        .build();
    let watcher = Arc::new(Watcher {
        backlog,
        started: Instant::now(),
        done: std::sync::OnceLock::new(),
    });
    eprintln!(
        "purge: backlog={backlog} batch={} pause_ms={}",
        options.batch,
        options.pause.as_millis()
    );
    // One sweep runs at once and goes on until the backlog is gone; the next is an hour
    // away, past any run.
    let handle = sweeper.spawn_sweeper(Duration::from_secs(3600));
    let polling = backend.clone();
    let watching = watcher.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            match polling.any_expired().await {
                Ok(true) => {}
                Ok(false) => {
                    let seconds = watching.started.elapsed().as_secs_f64();
                    let _ = watching.done.set(seconds);
                    eprintln!(
                        "purge: done backlog={} seconds={seconds:.2} rows_per_s={:.0}",
                        watching.backlog,
                        watching.backlog as f64 / seconds
                    );
                    return;
                }
                Err(Failure::Unreachable(e) | Failure::Other(e)) => {
                    eprintln!("purge: watching failed: {e}")
                }
            }
        }
    });
    Ok((handle, watcher))
}

/// When the sweeper's backlog was gone.
struct Watcher {
    backlog: u64,
    started: Instant,
    done: std::sync::OnceLock<f64>,
}

impl Watcher {
    /// At shutdown: the backlog left and the rate so far, if the sweep had not finished.
    async fn report_unfinished(&self, backend: &Backend) -> Result<(), Failure> {
        if self.done.get().is_some() {
            return Ok(());
        }
        let seconds = self.started.elapsed().as_secs_f64();
        let left = backend.expired_count().await?;
        eprintln!(
            "purge: unfinished backlog={} left={left} seconds={seconds:.2} rows_per_s={:.0}",
            self.backlog,
            self.backlog.saturating_sub(left) as f64 / seconds
        );
        Ok(())
    }
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
