//! The demo's store and database, chosen by URL scheme: SQLite (the embedded default),
//! Postgres, MySQL/MariaDB or Redis. With an SQL database the idempotency store and the
//! demo's own tables share one pool; Redis keeps only the idempotency records, so the
//! demo's tables then live in a separate SQL database (an SQLite file by default).

use std::sync::Arc;

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
        let store = SqliteStore::open(url).await?;
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
        // sqlx knows only the `mysql:` scheme; MariaDB speaks the same protocol.
        let url = match url.strip_prefix("mariadb:") {
            Some(rest) => format!("mysql:{rest}"),
            None => url.to_owned(),
        };
        let store = MySqlStore::connect(&url).await?;
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

    #[test]
    fn mysql_placeholders_are_positional() {
        assert_eq!(
            super::positional_placeholders("INSERT INTO t (a, b) VALUES ($1, $12) -- costs $"),
            "INSERT INTO t (a, b) VALUES (?, ?) -- costs $"
        );
    }
}
