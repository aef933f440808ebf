//! The demo's store and database, chosen by URL scheme: SQLite (the embedded default),
//! Postgres, MySQL/MariaDB or Redis. With an SQL database the idempotency store and the
//! demo's own tables share one pool; Redis keeps only the idempotency records, so the
//! demo's tables then live in a separate SQL database (an SQLite file by default).

use std::sync::Arc;
use std::time::Duration;

use idempotent_runtime::Store;
#[cfg(feature = "mysql")]
use idempotent_runtime::store::MySqlStore;
#[cfg(feature = "postgres")]
use idempotent_runtime::store::PostgresStore;
#[cfg(feature = "redis")]
use idempotent_runtime::store::RedisStore;
use idempotent_runtime::store::SqliteStore;

/// A connected SQL database of any supported kind.
#[derive(Debug, Clone)]
pub enum Database {
    /// An SQLite file.
    Sqlite(sqlx::SqlitePool),
    /// A Postgres server.
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    /// A MySQL 8 or MariaDB 10.6+ server.
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
}

/// Runs the same statement on whichever pool the database has. Statements use `$N`
/// placeholders (SQLite and Postgres); pass them through [`Database::dialect`] first so
/// they run on MySQL too.
#[macro_export]
macro_rules! on_pool {
    ($db:expr, |$pool:ident| $body:expr) => {
        match $db {
            $crate::database::Database::Sqlite($pool) => $body,
            #[cfg(feature = "postgres")]
            $crate::database::Database::Postgres($pool) => $body,
            #[cfg(feature = "mysql")]
            $crate::database::Database::MySql($pool) => $body,
        }
    };
}

/// Why the demo could not start on its database.
#[derive(Debug, thiserror::Error)]
pub enum DatabaseError {
    /// Opening the idempotency store failed (the message names the URL, password redacted).
    #[error(transparent)]
    Store(#[from] idempotent_runtime::StoreError),
    /// Creating the demo's own tables failed.
    #[error("creating the demo tables failed: {0}")]
    Schema(#[from] sqlx::Error),
    /// The database still refused connections when the startup wait ran out (see
    /// [`wait_until_reachable`]).
    #[error("the database at {location} was not reachable within {}: {reason}", idempotent_runtime::duration::format(*.waited))]
    Unreachable {
        /// The database URL, password redacted.
        location: String,
        /// How long the demo was to wait (`--database-wait`).
        waited: Duration,
        /// The last attempt's error.
        reason: String,
    },
    /// A URL of a kind the demo does not know.
    #[error(
        "unsupported database URL {}: use sqlite://FILE, postgres://USER@HOST/DB, \
         mysql://USER@HOST/DB or redis://HOST",
        redact_url(.0)
    )]
    Unsupported(String),
}

/// Opens the SQL database at `url` (`sqlite:`, `postgres:`, `mysql:`) and its
/// idempotency store (migrations applied), sharing one pool.
pub async fn open(url: &str) -> Result<(Database, Arc<dyn Store>), DatabaseError> {
    if url.starts_with("sqlite:") {
        let store = SqliteStore::connect(url).await?;
        let db = Database::Sqlite(store.pool().clone());
        return Ok((db, Arc::new(store)));
    }
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        let store = PostgresStore::connect(url).await?;
        let db = Database::Postgres(store.pool().clone());
        return Ok((db, Arc::new(store)));
    }
    #[cfg(feature = "mysql")]
    if url.starts_with("mysql:") || url.starts_with("mariadb:") {
        let store = MySqlStore::connect(&mysql_url(url)).await?;
        let db = Database::MySql(store.pool().clone());
        return Ok((db, Arc::new(store)));
    }
    Err(DatabaseError::Unsupported(url.to_owned()))
}

/// Opens the idempotency store at `url`, and the SQL database the demo keeps its own
/// tables in: the same one for an SQL URL (see [`open`]); for `redis://` (or `rediss://`,
/// or `redis+cluster://` for a cluster) a RedisStore, with the tables in `tables_url` (an SQL URL, e.g. an SQLite file).
///
/// A `key_prefix` query parameter on a Redis URL (`redis://host/?key_prefix=shop`) sets
/// the store's key prefix; it is removed before connecting.
pub async fn open_store(
    url: &str,
    tables_url: &str,
) -> Result<(Database, Arc<dyn Store>), DatabaseError> {
    #[cfg(feature = "redis")]
    if is_key_value_store(url) {
        let store = open_redis(url).await?;
        let db = open_tables(tables_url).await?;
        return Ok((db, Arc::new(store)));
    }
    let _ = tables_url;
    open(url).await
}

/// Opens the SQL database at `url` for the demo's own tables only (no idempotency store).
pub async fn open_tables(url: &str) -> Result<Database, DatabaseError> {
    let unreachable = |e: sqlx::Error| idempotent_runtime::StoreError::Open {
        location: redact_url(url),
        reason: e.to_string(),
    };
    if url.starts_with("sqlite:") {
        let options = SqliteStore::connect_options(url)?;
        let pool = sqlx::SqlitePool::connect_with(options)
            .await
            .map_err(unreachable)?;
        return Ok(Database::Sqlite(pool));
    }
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        let pool = sqlx::PgPool::connect(url).await.map_err(unreachable)?;
        return Ok(Database::Postgres(pool));
    }
    #[cfg(feature = "mysql")]
    if url.starts_with("mysql:") {
        let pool = sqlx::MySqlPool::connect(url).await.map_err(unreachable)?;
        return Ok(Database::MySql(pool));
    }
    Err(DatabaseError::Unsupported(url.to_owned()))
}

/// `url` with the `mariadb:` scheme as `mysql:`: sqlx knows only the `mysql:` scheme, and
/// MariaDB speaks the same protocol.
#[cfg(feature = "mysql")]
fn mysql_url(url: &str) -> String {
    match url.strip_prefix("mariadb:") {
        Some(rest) => format!("mysql:{rest}"),
        None => url.to_owned(),
    }
}

/// How long one connection attempt of [`wait_until_reachable`] may take (a host that
/// drops packets leaves it hanging), whatever is left of the wait.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Waits, for at most `bound`, until the SQL database at `url` (Postgres, MySQL/MariaDB)
/// accepts a connection, so that an instance started while its database is down (both
/// restarting, a failover) starts once the database is back instead of exiting. Each
/// failed attempt is logged at `warn` ("waiting for the database"), with the URL
/// (password redacted) and the error.
///
/// Returns at once for SQLite (a file the store creates) and other URLs, and as soon as
/// an attempt fails for a reason waiting cannot cure (a wrong password, no such
/// database): opening the store then reports it. [`DatabaseError::Unreachable`] when the
/// database still refuses connections at the bound (one attempt for a zero bound; an
/// attempt takes at most 5 s).
pub async fn wait_until_reachable(url: &str, bound: Duration) -> Result<(), DatabaseError> {
    let started = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(250);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let left = bound.saturating_sub(started.elapsed());
        let error = match tokio::time::timeout(left.max(ATTEMPT_TIMEOUT), connect_once(url)).await {
            Ok(Ok(())) => break,
            Ok(Err(err)) if is_transient(&err) => err.to_string(),
            Ok(Err(_)) => return Ok(()),
            Err(_) => "no answer".to_owned(),
        };
        let waited = started.elapsed();
        if waited >= bound {
            return Err(DatabaseError::Unreachable {
                location: redact_url(url),
                waited: bound,
                reason: error,
            });
        }
        tracing::warn!(
            database = %redact_url(url),
            %error,
            attempt = attempts,
            waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
            up_to_s = bound.as_secs(),
            "the database is not reachable yet; waiting for the database"
        );
        // The last attempt is at the bound.
        tokio::time::sleep(pause.min(bound - waited)).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
    if attempts > 1 {
        tracing::info!(database = %redact_url(url), "the database is reachable; starting");
    }
    Ok(())
}

/// One connection to the SQL database at `url`, closed again; `Ok` for a URL that names
/// no server to wait for.
async fn connect_once(url: &str) -> Result<(), sqlx::Error> {
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    use sqlx::Connection;
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        return sqlx::PgConnection::connect(url).await?.close().await;
    }
    #[cfg(feature = "mysql")]
    if url.starts_with("mysql:") || url.starts_with("mariadb:") {
        return sqlx::MySqlConnection::connect(&mysql_url(url))
            .await?
            .close()
            .await;
    }
    let _ = url;
    Ok(())
}

/// Whether `err` is an outage that a retry outlives — the connection was lost or
/// refused, no pooled connection came in time, the server is shutting down, starting up
/// or out of connections, a deadlock or a serialization failure — rather than a bug or
/// bad data. A handler answers such an error `503` with `Retry-After`, not `500`: a
/// retrying client stops at a `500`.
pub fn is_transient(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(err) => err.code().is_some_and(|code| transient_sqlstate(&code)),
        _ => false,
    }
}

/// SQLSTATEs (Postgres, MySQL/MariaDB) of outages: class `08` (connection exception),
/// `57P01`–`57P03` (shutting down, crashed, starting up), `53300` (too many connections),
/// `40001` (serialization failure; a deadlock on MySQL) and `40P01` (a deadlock).
fn transient_sqlstate(code: &str) -> bool {
    code.starts_with("08")
        || matches!(
            code,
            "57P01" | "57P02" | "57P03" | "53300" | "40001" | "40P01"
        )
}

/// Whether `url` names a store that keeps no tables of the demo (Redis, or a Redis
/// Cluster: `redis+cluster://host:port/`).
pub fn is_key_value_store(url: &str) -> bool {
    ["redis:", "rediss:", "redis+cluster:", "rediss+cluster:"]
        .iter()
        .any(|scheme| url.starts_with(scheme))
}

#[cfg(feature = "redis")]
async fn open_redis(url: &str) -> Result<RedisStore, DatabaseError> {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return Err(DatabaseError::Unsupported(url.to_owned()));
    };
    let prefix = parsed
        .query_pairs()
        .find(|(name, _)| name == "key_prefix")
        .map(|(_, value)| value.into_owned());
    let rest: Vec<(String, String)> = parsed
        .query_pairs()
        .filter(|(name, _)| name != "key_prefix")
        .map(|(name, value)| (name.into_owned(), value.into_owned()))
        .collect();
    if rest.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(rest);
    }
    let mut builder = RedisStore::builder();
    if let Some(prefix) = prefix {
        builder = builder.key_prefix(prefix);
    }
    Ok(builder.connect(parsed.as_str()).await?)
}

/// `url` fit for a log line (the runtime's redaction: passwords in the user-info and the
/// query replaced by `***`); a URL that does not parse is not shown at all, since it might
/// hold a password where none is expected.
pub fn redact_url(url: &str) -> String {
    idempotent_runtime::store::redacted_url(url)
        .unwrap_or_else(|| "<unparseable database URL>".to_owned())
}

impl Database {
    /// `statement` (with `$N` placeholders, each used once and in order) in this
    /// database's dialect: MySQL's placeholders are positional `?`.
    pub fn dialect(&self, statement: &str) -> String {
        match self {
            #[cfg(feature = "mysql")]
            Database::MySql(_) => positional_placeholders(statement),
            _ => statement.to_owned(),
        }
    }

    /// Runs `statements` (separated by `;`), for `CREATE TABLE IF NOT EXISTS` schemas.
    pub async fn execute_script(&self, script: &str) -> Result<(), sqlx::Error> {
        for statement in script.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            on_pool!(self, |pool| sqlx::query(sqlx::AssertSqlSafe(statement))
                .execute(pool)
                .await
                .map(|done| done.rows_affected()))?;
        }
        Ok(())
    }
}

/// `$1`, `$2`, … replaced by `?`.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
fn positional_placeholders(statement: &str) -> String {
    let mut out = String::with_capacity(statement.len());
    let mut chars = statement.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            while chars.peek().is_some_and(char::is_ascii_digit) {
                chars.next();
            }
            out.push('?');
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn redacts_passwords_in_user_info_and_query() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/pay"),
            "postgres://app:***@db:5432/pay"
        );
        assert_eq!(
            redact_url("postgres://app@db/pay?sslmode=require&password=s3cret"),
            "postgres://app@db/pay?sslmode=require&password=***"
        );
        assert_eq!(
            redact_url("postgres://db/pay?sslpassword=s3cret"),
            "postgres://db/pay?sslpassword=***"
        );
    }

    #[test]
    fn leaves_urls_without_secrets_as_given() {
        for url in [
            "postgres://app@db/pay",
            "sqlite://payments.db",
            "sqlite:payments.db?mode=rwc",
        ] {
            assert_eq!(redact_url(url), url);
        }
        assert_eq!(redact_url("not a url"), "<unparseable database URL>");
    }

    /// A database error with a SQLSTATE, as a driver reports it.
    #[derive(Debug)]
    struct Coded(&'static str);

    impl std::fmt::Display for Coded {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "SQLSTATE {}", self.0)
        }
    }

    impl std::error::Error for Coded {}

    impl sqlx::error::DatabaseError for Coded {
        fn message(&self) -> &str {
            "test"
        }

        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }

        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }

        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }

        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }

        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    #[test]
    fn outages_are_transient_and_bugs_are_not() {
        use super::is_transient;
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(is_transient(&sqlx::Error::Io(refused)));
        assert!(is_transient(&sqlx::Error::PoolTimedOut));
        for outage in [
            "08006", "08S01", "57P01", "57P03", "53300", "40001", "40P01",
        ] {
            assert!(
                is_transient(&sqlx::Error::Database(Box::new(Coded(outage)))),
                "{outage}"
            );
        }
        for bug in ["23505", "42P01", "22003", "28P01"] {
            assert!(
                !is_transient(&sqlx::Error::Database(Box::new(Coded(bug)))),
                "{bug}"
            );
        }
        assert!(!is_transient(&sqlx::Error::RowNotFound));
        assert!(!is_transient(&sqlx::Error::Protocol("bad message".into())));
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn the_startup_wait_gives_up_at_its_bound_naming_the_database() {
        let bound = std::time::Duration::from_secs(1);
        let started = std::time::Instant::now();
        // Nothing listens on port 1: every attempt is refused.
        let error = super::wait_until_reachable("postgres://demo:s3cret@127.0.0.1:1/pay", bound)
            .await
            .expect_err("nothing listens on port 1");
        let waited = started.elapsed();
        assert!(waited >= bound, "{waited:?}: it retried until the bound");
        assert!(
            waited < std::time::Duration::from_secs(3),
            "{waited:?}: bounded"
        );
        let message = error.to_string();
        assert!(
            message.contains("postgres://demo:***@127.0.0.1:1/pay")
                && message.contains("within 1s"),
            "{message}"
        );
        assert!(!message.contains("s3cret"), "{message}");
    }

    #[tokio::test]
    async fn there_is_nothing_to_wait_for_on_sqlite() {
        let bound = std::time::Duration::from_secs(5);
        super::wait_until_reachable("sqlite://payments.db", bound)
            .await
            .expect("a file, not a server");
    }

    #[test]
    fn mysql_placeholders_are_positional() {
        assert_eq!(
            super::positional_placeholders("INSERT INTO t (a, b) VALUES ($1, $12) -- costs $"),
            "INSERT INTO t (a, b) VALUES (?, ?) -- costs $"
        );
    }
}
