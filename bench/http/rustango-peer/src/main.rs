//! The rustango peer of the benchmark server: the same order handler
//! (`../../src/order.rs`) behind rustango 0.62's `IdempotencyLayer` over its
//! `DatabaseCache`, on SQLite (NORMAL or FULL) or Postgres. Same routes, flags and exit
//! status as the main server (`../src/main.rs`).
//!
//! - `rustango-sqlite-full`: rustango's own SQLite pool (`Pool::connect_sqlite`: WAL,
//!   foreign keys, 5 s busy timeout, and SQLite's default `synchronous = FULL`).
//! - `rustango-sqlite-normal`: the same options and pool settings, with
//!   `synchronous = NORMAL` (rustango has no setting for it, so the pool is built here).
//! - `rustango-postgres`: rustango's own Postgres pool (`Pool::connect_postgres`).

#[path = "../../src/order.rs"]
mod order;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use rustango::cache::{BoxedCache, DatabaseCache};
use rustango::idempotency::{IdempotencyLayer, IdempotencyRouterExt};
use rustango::sql::Pool;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::order::Counters;

/// The cache table, dropped and created again each time a server starts.
const CACHE_TABLE: &str = "rustango_bench_cache";

/// How long a response is kept, as for the other variants.
const TTL: Duration = Duration::from_secs(600);

/// rustango's default pool acquire timeout and SQLite busy timeout.
const RUSTANGO_TIMEOUT: Duration = Duration::from_secs(5);

/// Default `IDEMPOTENT_BENCH_POSTGRES_URL`.
const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

const USAGE: &str = "usage: rustango-peer --variant rustango-sqlite-normal|rustango-sqlite-full|rustango-postgres [--addr 127.0.0.1:38080] [--data-dir DIR]";

/// Where the cache lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    SqliteNormal,
    SqliteFull,
    Postgres,
}

impl Backend {
    const ALL: [(&'static str, Backend); 3] = [
        ("rustango-sqlite-normal", Backend::SqliteNormal),
        ("rustango-sqlite-full", Backend::SqliteFull),
        ("rustango-postgres", Backend::Postgres),
    ];

    fn parse(name: &str) -> Option<Backend> {
        Self::ALL
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, backend)| backend)
    }
}

/// The command line.
struct Args {
    name: String,
    backend: Backend,
    addr: String,
    data_dir: PathBuf,
}

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
                let backend = Backend::parse(&name).ok_or(format!("unknown variant {name}"))?;
                variant = Some((name, backend));
            }
            "--addr" => addr = value()?,
            "--data-dir" => data_dir = PathBuf::from(value()?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let (name, backend) = variant.ok_or("--variant is required")?;
    Ok(Args {
        name,
        backend,
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
    let cache = match open_cache(args.backend, &args.data_dir).await {
        Ok(cache) => cache,
        Err(reason) => {
            eprintln!("skipped: {}: store unreachable: {reason}", args.name);
            return ExitCode::from(3);
        }
    };
    let app = Router::new()
        .route("/orders", post(order::create_order))
        .route("/orders/slow", post(order::create_slow_order))
        .idempotency(IdempotencyLayer::new(cache).ttl(TTL))
        .route("/stats", get(order::stats))
        .with_state(Counters::default());
    let listener = match tokio::net::TcpListener::bind(&args.addr).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("cannot listen on {}: {e}", args.addr);
            return ExitCode::FAILURE;
        }
    };
    println!("ready: {} on {}", args.name, args.addr);
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
    {
        eprintln!("server error: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// An empty `DatabaseCache` on `backend`.
async fn open_cache(backend: Backend, data_dir: &Path) -> Result<BoxedCache, String> {
    let pool = match backend {
        Backend::SqliteNormal | Backend::SqliteFull => {
            let pool = sqlite_pool(backend, data_dir).await?;
            let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
                .fetch_one(&pool)
                .await
                .map_err(|e| e.to_string())?;
            eprintln!("sqlite: synchronous = {synchronous}");
            Pool::from(pool)
        }
        Backend::Postgres => {
            let url = std::env::var("IDEMPOTENT_BENCH_POSTGRES_URL")
                .ok()
                .filter(|url| !url.is_empty())
                .unwrap_or_else(|| DEFAULT_POSTGRES_URL.to_owned());
            let pool = Pool::connect_postgres(&url)
                .await
                .map_err(|e| format!("postgres: {e}"))?;
            sqlx::query(&format!("DROP TABLE IF EXISTS {CACHE_TABLE}"))
                .execute(&pool)
                .await
                .map_err(|e| format!("postgres: dropping the previous table: {e}"))?;
            Pool::from(pool)
        }
    };
    let cache = DatabaseCache::new(pool, CACHE_TABLE);
    cache.ensure_table().await.map_err(|e| e.to_string())?;
    Ok(Arc::new(cache))
}

/// A fresh database file: rustango's own pool at FULL, or the same settings at NORMAL.
async fn sqlite_pool(backend: Backend, data_dir: &Path) -> Result<SqlitePool, String> {
    let name = match backend {
        Backend::SqliteFull => "rustango-full.db",
        _ => "rustango-normal.db",
    };
    let path = data_dir.join(format!("{}-{name}", std::process::id()));
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
    let url = format!("sqlite://{}", path.display());
    if backend == Backend::SqliteFull {
        return Pool::connect_sqlite(&url).await.map_err(|e| e.to_string());
    }
    // What `Pool::connect_sqlite` sets, plus `synchronous = NORMAL`.
    let options = SqliteConnectOptions::from_str(&url)
        .map_err(|e| e.to_string())?
        .create_if_missing(true)
        .foreign_keys(true)
        .busy_timeout(RUSTANGO_TIMEOUT)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal);
    SqlitePoolOptions::new()
        .acquire_timeout(RUSTANGO_TIMEOUT)
        .test_before_acquire(false)
        .connect_with(options)
        .await
        .map_err(|e| e.to_string())
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
