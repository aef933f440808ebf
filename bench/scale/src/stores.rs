//! The three SQL stores as the benchmark uses them: emptied, opened, bulk-loaded from a
//! template record, measured on disk, and asked how many expired records remain. Each
//! database gets a place of its own (a file, a schema, a database) that a later
//! `prepare` drops.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idempotent_runtime::Store;
use idempotent_runtime::store::{MySqlStore, PostgresStore, SqliteStore};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Row};

use crate::Failure;
use crate::records::{SCATTER, SCOPE};

/// The Postgres schema the benchmark's table lives in.
const POSTGRES_SCHEMA: &str = "idempotent_scale";

/// The schema-qualified Postgres table.
const POSTGRES_TABLE: &str = "idempotent_scale.idempotency_records";

/// The MySQL database the benchmark's table lives in, beside the URL's own.
const MYSQL_DATABASE: &str = "idempotent_scale";

/// How many records one bulk statement inserts (one transaction each).
const CHUNK: u64 = 200_000;

/// Which store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Sqlite,
    Postgres,
    MySql,
}

impl StoreKind {
    /// By its command-line name.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "sqlite" => Some(Self::Sqlite),
            "postgres" => Some(Self::Postgres),
            "mysql" => Some(Self::MySql),
            _ => None,
        }
    }

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
            Self::MySql => "mysql",
        }
    }
}

/// A store's database, with a small pool of the benchmark's own for loading and
/// measuring (the store has its own pool).
#[derive(Debug, Clone)]
pub enum Backend {
    Sqlite {
        path: PathBuf,
        pool: SqlitePool,
    },
    Postgres {
        url: String,
        pool: PgPool,
    },
    // Boxed: connect options are large beside the other variants.
    MySql {
        options: Box<MySqlConnectOptions>,
        pool: MySqlPool,
    },
}

/// Bytes on disk of the table and its indexes.
pub struct Size {
    pub rows: u64,
    pub table_bytes: u64,
    pub index_bytes: u64,
    /// How they were measured.
    pub how: &'static str,
}

/// `name` from the environment, or `default`.
fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|value| !value.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

fn unreachable(e: impl std::fmt::Display) -> Failure {
    Failure::Unreachable(e.to_string())
}

/// Wall-clock milliseconds: the SQLite store's clock (`SystemClock`).
fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Backend {
    /// The store's database, emptied.
    pub async fn reset(kind: StoreKind, data_dir: &Path) -> Result<Self, Failure> {
        Self::drop_all(kind, data_dir).await?;
        if kind == StoreKind::MySql {
            let mut conn = mysql_server().await?;
            sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {MYSQL_DATABASE}")))
                .execute(&mut conn)
                .await?;
            conn.close().await?;
        }
        Self::existing(kind, data_dir).await
    }

    /// Drops what the benchmark created for the store: its SQLite file, its Postgres
    /// schema or its MySQL database (they take gigabytes at 10M records).
    pub async fn drop_all(kind: StoreKind, data_dir: &Path) -> Result<(), Failure> {
        match kind {
            StoreKind::Sqlite => {
                let path = sqlite_path(data_dir);
                for suffix in ["", "-wal", "-shm"] {
                    let mut file = path.as_os_str().to_owned();
                    file.push(suffix);
                    match std::fs::remove_file(&file) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                        _ => {}
                    }
                }
            }
            StoreKind::Postgres => {
                let url = postgres_url();
                let mut conn = sqlx::PgConnection::connect(&url)
                    .await
                    .map_err(unreachable)?;
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "DROP SCHEMA IF EXISTS {POSTGRES_SCHEMA} CASCADE"
                )))
                .execute(&mut conn)
                .await?;
                conn.close().await?;
            }
            StoreKind::MySql => {
                let mut conn = mysql_server().await?;
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {MYSQL_DATABASE}"
                )))
                .execute(&mut conn)
                .await?;
                conn.close().await?;
            }
        }
        Ok(())
    }

    /// The store's database as a previous `prepare` left it.
    pub async fn existing(kind: StoreKind, data_dir: &Path) -> Result<Self, Failure> {
        Ok(match kind {
            StoreKind::Sqlite => {
                let path = sqlite_path(data_dir);
                let options = SqliteConnectOptions::new()
                    .filename(&path)
                    .create_if_missing(true)
                    .busy_timeout(Duration::from_secs(30))
                    // The bulk copy inserts every key on a random page of the key index:
                    // with SQLite's 2 MB default cache, a load past a few million records
                    // reads and writes back a page per record.
                    .pragma("cache_size", "-2097152");
                let pool = SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect_with(options)
                    .await?;
                Backend::Sqlite { path, pool }
            }
            StoreKind::Postgres => {
                let url = postgres_url();
                let pool = PgPoolOptions::new()
                    .max_connections(2)
                    .connect(&url)
                    .await
                    .map_err(unreachable)?;
                Backend::Postgres { url, pool }
            }
            StoreKind::MySql => {
                let options = MySqlConnectOptions::from_str(&mysql_url())?.database(MYSQL_DATABASE);
                let pool = MySqlPoolOptions::new()
                    .max_connections(2)
                    .connect_with(options.clone())
                    .await
                    .map_err(unreachable)?;
                Backend::MySql {
                    options: Box::new(options),
                    pool,
                }
            }
        })
    }

    /// The store over this database, as the HTTP benchmark opens it (which applies its
    /// migrations).
    pub async fn open_store(&self) -> Result<Arc<dyn Store>, Failure> {
        Ok(match self {
            Backend::Sqlite { path, .. } => {
                let path = path.to_str().ok_or("the data directory is not UTF-8")?;
                Arc::new(SqliteStore::connect(path).await?)
            }
            Backend::Postgres { url, .. } => {
                Arc::new(PostgresStore::connect_in_schema(url, POSTGRES_SCHEMA).await?)
            }
            Backend::MySql { options, .. } => {
                // The pool `MySqlStore::connect` builds, as the HTTP benchmark's.
                let pool = MySqlPoolOptions::new()
                    .test_before_acquire(false)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect_with(options.as_ref().clone())
                    .await?;
                Arc::new(MySqlStore::from_pool(pool).await?)
            }
        })
    }

    /// Waits (up to 10 s) until the record of `key` is completed: the engine records a
    /// completion after it answers.
    pub async fn wait_completed(&self, key: &str) -> Result<(), Failure> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let completed: i64 = match self {
                Backend::Sqlite { pool, .. } => {
                    sqlx::query_scalar(
                        "SELECT count(*) FROM idempotency_records \
                         WHERE scope = ? AND key = ? AND state = 'completed'",
                    )
                    .bind(SCOPE)
                    .bind(key)
                    .fetch_one(pool)
                    .await?
                }
                Backend::Postgres { pool, .. } => {
                    sqlx::query_scalar(AssertSqlSafe(format!(
                        "SELECT count(*) FROM {POSTGRES_TABLE} \
                         WHERE scope = $1 AND key = $2 AND state = 'completed'"
                    )))
                    .bind(SCOPE)
                    .bind(key)
                    .fetch_one(pool)
                    .await?
                }
                Backend::MySql { pool, .. } => {
                    sqlx::query_scalar(
                        "SELECT count(*) FROM idempotency_records \
                         WHERE scope = ? AND `key` = ? AND state = 'completed'",
                    )
                    .bind(SCOPE.as_bytes())
                    .bind(key.as_bytes())
                    .fetch_one(pool)
                    .await?
                }
            };
            if completed == 1 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Failure::Other(format!("{key} was not completed in 10 s")));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Copies the record of `template` (key 0) to keys 1 .. `live` (live: expiring in key
    /// order over the 24 hours after the next 24, so that none expires during a load that
    /// takes hours or the runs after it) and `live` .. `live + expired` (expired over the
    /// past hour), inside the database, `CHUNK` records per statement.
    pub async fn bulk_copy(&self, template: &str, live: u64, expired: u64) -> Result<(), Failure> {
        if let Backend::MySql { pool, .. } = self {
            // 0..999, to number the rows of a chunk (MySQL has no generate_series).
            sqlx::raw_sql(
                "CREATE TABLE idempotent_scale_seq (n INT PRIMARY KEY); \
                 INSERT INTO idempotent_scale_seq (n) \
                 SELECT a.n * 100 + b.n * 10 + c.n FROM \
                 (SELECT 0 n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                  UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                  UNION ALL SELECT 8 UNION ALL SELECT 9) a, \
                 (SELECT 0 n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                  UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                  UNION ALL SELECT 8 UNION ALL SELECT 9) b, \
                 (SELECT 0 n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                  UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                  UNION ALL SELECT 8 UNION ALL SELECT 9) c",
            )
            .execute(pool)
            .await?;
        }
        let total = live + expired;
        let now = now_millis();
        let started = Instant::now();
        let mut lo = 1;
        while lo < total {
            let hi = (lo + CHUNK).min(total);
            self.copy_chunk(template, lo, hi, live, expired.max(1), now)
                .await?;
            eprintln!(
                "  loaded {hi} of {total} records ({:.0} s)",
                started.elapsed().as_secs_f64()
            );
            lo = hi;
        }
        if let Backend::MySql { pool, .. } = self {
            sqlx::raw_sql("DROP TABLE idempotent_scale_seq")
                .execute(pool)
                .await?;
        }
        Ok(())
    }

    /// Keys `lo .. hi` (see [`bulk_copy`](Self::bulk_copy)); `now` is the SQLite store's
    /// clock in milliseconds. The numbers are the benchmark's own and go into the SQL as
    /// literals; the template's scope and key are bound.
    async fn copy_chunk(
        &self,
        template: &str,
        lo: u64,
        hi: u64,
        live: u64,
        expired: u64,
        now: i64,
    ) -> Result<(), Failure> {
        match self {
            Backend::Sqlite { pool, .. } => {
                let sql = format!(
                    "WITH RECURSIVE seq(g) AS (SELECT {lo} UNION ALL SELECT g + 1 FROM seq WHERE g + 1 < {hi}) \
                     INSERT INTO idempotency_records \
                        (scope, key, fingerprint, fingerprint_version, state, token, \
                         lease_expires_at, status, headers, body, created_at, expires_at, \
                         lease_boot_id, lease_ends_boot_ms) \
                     SELECT t.scope, \
                            printf('%08x-0000-4000-8000-%012d', (g * {SCATTER}) % 4294967296, g), \
                            t.fingerprint, t.fingerprint_version, t.state, t.token, \
                            t.lease_expires_at, t.status, t.headers, t.body, {now} - 3600000, \
                            CASE WHEN g < {live} THEN {now} + 86400000 + 86400000 * g / {live} \
                                 ELSE {now} - 1000 - 3600000 * (g - {live}) / {expired} END, \
                            t.lease_boot_id, t.lease_ends_boot_ms \
                     FROM seq, idempotency_records AS t WHERE t.scope = ? AND t.key = ?"
                );
                sqlx::query(AssertSqlSafe(sql))
                    .bind(SCOPE)
                    .bind(template)
                    .execute(pool)
                    .await?;
            }
            Backend::Postgres { pool, .. } => {
                let sql = format!(
                    "INSERT INTO {POSTGRES_TABLE} \
                        (scope, key, fingerprint, fingerprint_version, state, token, \
                         lease_expires_at, status, headers, body, created_at, expires_at) \
                     SELECT t.scope, \
                            lpad(to_hex((g * {SCATTER}) % 4294967296), 8, '0') \
                                || '-0000-4000-8000-' || lpad(g::text, 12, '0'), \
                            t.fingerprint, t.fingerprint_version, t.state, t.token, \
                            t.lease_expires_at, t.status, t.headers, t.body, \
                            now() - interval '1 hour', \
                            CASE WHEN g < {live} \
                                 THEN now() + make_interval(secs => 86400 + 86400.0::float8 * g / {live}) \
                                 ELSE now() - make_interval(secs => 1 + 3600.0::float8 * (g - {live}) / {expired}) END \
                     FROM generate_series({lo}::bigint, {hi}::bigint - 1) AS g, {POSTGRES_TABLE} AS t \
                     WHERE t.scope = $1 AND t.key = $2"
                );
                sqlx::query(AssertSqlSafe(sql))
                    .bind(SCOPE)
                    .bind(template)
                    .execute(pool)
                    .await?;
            }
            Backend::MySql { pool, .. } => {
                let thousands = (hi - lo).div_ceil(1000);
                // The primary key as the store computes it: SHA-256 over the scope's byte
                // length (8 bytes, big-endian), the scope and the key.
                let sql = format!(
                    "INSERT INTO idempotency_records \
                        (scope_key_sha256, scope, `key`, fingerprint, fingerprint_version, \
                         state, token, lease_expires_at, status, headers, body, created_at, \
                         expires_at) \
                     SELECT UNHEX(SHA2(CONCAT(UNHEX(LPAD(HEX(LENGTH(t.scope)), 16, '0')), \
                                              t.scope, g.k), 256)), \
                            t.scope, g.k, t.fingerprint, t.fingerprint_version, t.state, \
                            t.token, t.lease_expires_at, t.status, t.headers, t.body, \
                            UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, \
                            IF(g.n < {live}, \
                               UTC_TIMESTAMP(6) + INTERVAL CAST(86400000000 + 86400000000 * g.n / {live} AS SIGNED) MICROSECOND, \
                               UTC_TIMESTAMP(6) - INTERVAL CAST(1000000 + 3600000000 * (g.n - {live}) / {expired} AS SIGNED) MICROSECOND) \
                     FROM (SELECT s.n, CAST(CONCAT(LPAD(LOWER(HEX((s.n * {SCATTER}) % 4294967296)), 8, '0'), \
                                                   '-0000-4000-8000-', LPAD(s.n, 12, '0')) AS BINARY) AS k \
                           FROM (SELECT {lo} + a.n * 1000 + b.n AS n \
                                 FROM idempotent_scale_seq a CROSS JOIN idempotent_scale_seq b \
                                 WHERE a.n < {thousands}) AS s \
                           WHERE s.n < {hi}) AS g, \
                          idempotency_records AS t \
                     WHERE t.scope = ? AND t.`key` = ?"
                );
                sqlx::query(AssertSqlSafe(sql))
                    .bind(SCOPE.as_bytes())
                    .bind(template.as_bytes())
                    .execute(pool)
                    .await?;
            }
        }
        Ok(())
    }

    /// The table's and its indexes' bytes on disk, statistics refreshed first.
    pub async fn size(&self) -> Result<Size, Failure> {
        Ok(match self {
            Backend::Sqlite { pool, path } => {
                sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                    .execute(pool)
                    .await?;
                let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_records")
                    .fetch_one(pool)
                    .await?;
                // dbstat (when SQLite was built with it): the pages of the table and of
                // each of its indexes.
                let pages = sqlx::query(
                    "SELECT coalesce(sum(CASE WHEN name = 'idempotency_records' THEN pgsize END), 0), \
                            coalesce(sum(CASE WHEN name <> 'idempotency_records' THEN pgsize END), 0) \
                     FROM dbstat WHERE name IN \
                        (SELECT name FROM sqlite_schema WHERE tbl_name = 'idempotency_records')",
                )
                .fetch_one(pool)
                .await;
                match pages {
                    Ok(row) => Size {
                        rows: rows as u64,
                        table_bytes: row.try_get::<i64, _>(0)? as u64,
                        index_bytes: row.try_get::<i64, _>(1)? as u64,
                        how: "dbstat",
                    },
                    Err(_) => Size {
                        rows: rows as u64,
                        table_bytes: std::fs::metadata(path)?.len(),
                        index_bytes: 0,
                        how: "file",
                    },
                }
            }
            Backend::Postgres { pool, .. } => {
                // A table in service has been vacuumed and checkpointed long since: without
                // this, the runs after a bulk load pay for setting its hint bits, for
                // autovacuum's first pass and for the load's checkpoint, in p99 spikes.
                sqlx::raw_sql(AssertSqlSafe(format!("VACUUM (ANALYZE) {POSTGRES_TABLE}")))
                    .execute(pool)
                    .await?;
                sqlx::raw_sql("CHECKPOINT").execute(pool).await?;
                let row = sqlx::query(AssertSqlSafe(format!(
                    "SELECT (SELECT count(*) FROM {POSTGRES_TABLE}), \
                            pg_table_size('{POSTGRES_TABLE}'), pg_indexes_size('{POSTGRES_TABLE}')"
                )))
                .fetch_one(pool)
                .await?;
                Size {
                    rows: row.try_get::<i64, _>(0)? as u64,
                    table_bytes: row.try_get::<i64, _>(1)? as u64,
                    index_bytes: row.try_get::<i64, _>(2)? as u64,
                    how: "pg_table_size+pg_indexes_size",
                }
            }
            Backend::MySql { pool, .. } => {
                sqlx::raw_sql("ANALYZE TABLE idempotency_records")
                    .execute(pool)
                    .await?;
                let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_records")
                    .fetch_one(pool)
                    .await?;
                let row = sqlx::query(
                    "SELECT CAST(data_length AS SIGNED), CAST(index_length AS SIGNED) \
                     FROM information_schema.TABLES \
                     WHERE table_schema = ? AND table_name = 'idempotency_records'",
                )
                .bind(MYSQL_DATABASE)
                .fetch_one(pool)
                .await?;
                Size {
                    rows: rows as u64,
                    table_bytes: row.try_get::<i64, _>(0)? as u64,
                    index_bytes: row.try_get::<i64, _>(1)? as u64,
                    how: "information_schema data_length+index_length",
                }
            }
        })
    }

    /// How many records have expired (by the expiry index).
    pub async fn expired_count(&self) -> Result<u64, Failure> {
        let count: i64 = match self {
            Backend::Sqlite { pool, .. } => {
                sqlx::query_scalar("SELECT count(*) FROM idempotency_records WHERE expires_at <= ?")
                    .bind(now_millis())
                    .fetch_one(pool)
                    .await?
            }
            Backend::Postgres { pool, .. } => {
                sqlx::query_scalar(AssertSqlSafe(format!(
                    "SELECT count(*) FROM {POSTGRES_TABLE} WHERE expires_at <= now()"
                )))
                .fetch_one(pool)
                .await?
            }
            Backend::MySql { pool, .. } => {
                sqlx::query_scalar(
                    "SELECT count(*) FROM idempotency_records WHERE expires_at <= UTC_TIMESTAMP(6)",
                )
                .fetch_one(pool)
                .await?
            }
        };
        Ok(count as u64)
    }

    /// Whether any record has expired: one probe of the expiry index.
    pub async fn any_expired(&self) -> Result<bool, Failure> {
        let any: i64 = match self {
            Backend::Sqlite { pool, .. } => {
                sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM idempotency_records WHERE expires_at <= ?)",
                )
                .bind(now_millis())
                .fetch_one(pool)
                .await?
            }
            Backend::Postgres { pool, .. } => {
                let any: bool = sqlx::query_scalar(AssertSqlSafe(format!(
                    "SELECT EXISTS (SELECT 1 FROM {POSTGRES_TABLE} WHERE expires_at <= now())"
                )))
                .fetch_one(pool)
                .await?;
                i64::from(any)
            }
            Backend::MySql { pool, .. } => {
                sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM idempotency_records \
                     WHERE expires_at <= UTC_TIMESTAMP(6))",
                )
                .fetch_one(pool)
                .await?
            }
        };
        Ok(any != 0)
    }
}

/// A connection to the MySQL server, in the URL's own database.
async fn mysql_server() -> Result<sqlx::MySqlConnection, Failure> {
    let options = MySqlConnectOptions::from_str(&mysql_url())?;
    // Bounded: a filtered port would otherwise hang the run.
    tokio::time::timeout(Duration::from_secs(10), options.connect())
        .await
        .map_err(|_| unreachable("no connection within 10 s"))?
        .map_err(unreachable)
}

fn sqlite_path(data_dir: &Path) -> PathBuf {
    data_dir.join("idempotent-scale.db")
}

fn postgres_url() -> String {
    env_or(
        "IDEMPOTENT_BENCH_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    )
}

fn mysql_url() -> String {
    env_or(
        "IDEMPOTENT_BENCH_MYSQL_URL",
        "mysql://root@127.0.0.1:3306/test",
    )
}
