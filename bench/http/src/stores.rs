//! Opens each of our stores empty: a fresh SQLite file, a fresh Postgres schema, a fresh
//! MySQL database, a fresh Redis key prefix. A store whose server cannot be reached is
//! [`Unreachable`].

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idempotent_runtime::Store;
use idempotent_runtime::store::{MemoryStore, MySqlStore, PostgresStore, RedisStore, SqliteStore};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::sqlite::{SqlitePool, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection};

use crate::variant::StoreKind;

/// The Postgres schema the benchmark's `idempotency_records` table lives in; dropped and
/// created again each time a server starts.
pub const POSTGRES_SCHEMA: &str = "idempotent_bench";

/// Default `IDEMPOTENT_BENCH_POSTGRES_URL`.
pub const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The MySQL database the benchmark's `idempotency_records` table lives in, beside the
/// URL's own database; dropped and created again each time a server starts.
pub const MYSQL_DATABASE: &str = "idempotent_bench";

/// Default `IDEMPOTENT_BENCH_MYSQL_URL`.
pub const DEFAULT_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/test";

/// Default `IDEMPOTENT_BENCH_REDIS_URL`.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379/";

/// A store's server could not be reached: the driver skips the variant.
#[derive(Debug)]
pub struct Unreachable(pub String);

/// Opens an empty store of `kind`. SQLite files go in `data_dir`.
pub async fn open(kind: StoreKind, data_dir: &Path) -> Result<Arc<dyn Store>, Unreachable> {
    match kind {
        StoreKind::Memory => Ok(Arc::new(MemoryStore::new())),
        StoreKind::SqliteNormal | StoreKind::SqliteFull => {
            let store = open_sqlite(kind, data_dir)
                .await
                .map_err(|e| Unreachable(e.to_string()))?;
            Ok(Arc::new(store))
        }
        StoreKind::Postgres => {
            let url = env_or("IDEMPOTENT_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL);
            let store = open_postgres(&url).await.map_err(Unreachable)?;
            Ok(Arc::new(store))
        }
        StoreKind::MySql => {
            let url = env_or("IDEMPOTENT_BENCH_MYSQL_URL", DEFAULT_MYSQL_URL);
            let store = open_mysql(&url).await.map_err(Unreachable)?;
            Ok(Arc::new(store))
        }
        StoreKind::Redis => {
            let url = env_or("IDEMPOTENT_BENCH_REDIS_URL", DEFAULT_REDIS_URL);
            let store = RedisStore::builder()
                .key_prefix(fresh_redis_prefix())
                .connect(&url)
                .await
                .map_err(|e| Unreachable(e.to_string()))?;
            eprintln!("redis: key prefix {}", store.key_prefix());
            Ok(Arc::new(store))
        }
    }
}

/// The store's own defaults (`SqliteStore::connect`: WAL, `synchronous = FULL`, its pool
/// options), or the same with `synchronous = NORMAL`.
async fn open_sqlite(
    kind: StoreKind,
    data_dir: &Path,
) -> Result<SqliteStore, Box<dyn std::error::Error>> {
    let name = match kind {
        StoreKind::SqliteFull => "idempotent-full.db",
        _ => "idempotent-normal.db",
    };
    let path = data_dir.join(format!("{}-{name}", std::process::id()));
    remove_database(&path)?;
    let path_str = path.to_str().ok_or("the data directory is not UTF-8")?;
    let store = if kind == StoreKind::SqliteFull {
        SqliteStore::connect(path_str).await?
    } else {
        let options =
            SqliteStore::connect_options(path_str)?.synchronous(SqliteSynchronous::Normal);
        let pool = SqliteStore::pool_options().connect_with(options).await?;
        SqliteStore::from_pool(pool).await?
    };
    eprintln!(
        "sqlite: {} synchronous = {}",
        path.display(),
        synchronous(store.pool()).await?
    );
    Ok(store)
}

/// `PRAGMA synchronous` as a pooled connection reports it (1 NORMAL, 2 FULL).
async fn synchronous(pool: &SqlitePool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(pool)
        .await
}

/// Removes an SQLite database file and its WAL companions, if present.
fn remove_database(path: &Path) -> std::io::Result<()> {
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        match std::fs::remove_file(&file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// Drops [`POSTGRES_SCHEMA`] (the previous run's records), then connects the store in
/// it, which creates it empty.
async fn open_postgres(url: &str) -> Result<PostgresStore, String> {
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .map_err(|e| format!("postgres: {e}"))?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {POSTGRES_SCHEMA} CASCADE"
    )))
    .execute(&mut conn)
    .await
    .map_err(|e| format!("postgres: dropping the previous schema: {e}"))?;
    conn.close().await.map_err(|e| format!("postgres: {e}"))?;
    PostgresStore::connect_in_schema(url, POSTGRES_SCHEMA)
        .await
        .map_err(|e| e.to_string())
}

/// Drops [`MYSQL_DATABASE`] (the previous run's records) and creates it empty, then
/// opens the store in it with the pool `MySqlStore::connect` builds (sqlx's defaults, no
/// ping before each use, 5 s acquire timeout), which applies the migrations. The URL's
/// own database is only connected to; its user needs `CREATE` and `DROP` on
/// [`MYSQL_DATABASE`].
async fn open_mysql(url: &str) -> Result<MySqlStore, String> {
    let fail = |e: &dyn std::fmt::Display| format!("mysql: {e}");
    let options = MySqlConnectOptions::from_str(url).map_err(|e| fail(&e))?;
    // Bounded: a filtered port would otherwise hang the start until the driver gives up.
    let mut conn = tokio::time::timeout(Duration::from_secs(10), options.connect())
        .await
        .map_err(|_| fail(&"no connection within 10 s"))?
        .map_err(|e| fail(&e))?;
    for statement in [
        format!("DROP DATABASE IF EXISTS {MYSQL_DATABASE}"),
        format!("CREATE DATABASE {MYSQL_DATABASE}"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&mut conn)
            .await
            .map_err(|e| fail(&format!("{statement}: {e}")))?;
    }
    log_mysql_durability(&mut conn)
        .await
        .map_err(|e| fail(&e))?;
    conn.close().await.map_err(|e| fail(&e))?;
    let pool = MySqlPoolOptions::new()
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options.database(MYSQL_DATABASE))
        .await
        .map_err(|e| fail(&e))?;
    MySqlStore::from_pool(pool).await.map_err(|e| e.to_string())
}

/// Logs the server's version and the settings that decide what a commit survives, so
/// each run's server log records them.
async fn log_mysql_durability(conn: &mut sqlx::MySqlConnection) -> Result<(), sqlx::Error> {
    let (version, flush, sync_binlog, log_bin): (String, i64, i64, i64) = sqlx::query_as(
        "SELECT VERSION(), CAST(@@innodb_flush_log_at_trx_commit AS SIGNED), \
         CAST(@@sync_binlog AS SIGNED), CAST(@@log_bin AS SIGNED)",
    )
    .fetch_one(&mut *conn)
    .await?;
    eprintln!(
        "mysql: {version} innodb_flush_log_at_trx_commit = {flush} sync_binlog = {sync_binlog} \
         log_bin = {log_bin}"
    );
    Ok(())
}

/// A key prefix no earlier run used, so the store starts empty; its keys expire with the
/// handler's TTL.
fn fresh_redis_prefix() -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("idempotent-bench-{}-{millis}", std::process::id())
}

/// `name` from the environment, or `default`.
pub fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|value| !value.is_empty())
        .unwrap_or_else(|| default.to_owned())
}
