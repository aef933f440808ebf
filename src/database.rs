//! The demo's database: SQLite (the embedded default) or Postgres, chosen by URL. The
//! idempotency store and the demo's own tables share one pool.

use std::sync::Arc;

use idempotent_runtime::Store;
#[cfg(feature = "postgres")]
use idempotent_runtime::store::PostgresStore;
use idempotent_runtime::store::SqliteStore;

/// A connected database of either kind.
#[derive(Debug, Clone)]
pub enum Database {
    /// An SQLite file.
    Sqlite(sqlx::SqlitePool),
    /// A Postgres server.
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
}

/// Runs the same statement on whichever pool the database has. Statements use `$N`
/// placeholders, which both SQLite and Postgres accept.
#[macro_export]
macro_rules! on_pool {
    ($db:expr, |$pool:ident| $body:expr) => {
        match $db {
            $crate::database::Database::Sqlite($pool) => $body,
            #[cfg(feature = "postgres")]
            $crate::database::Database::Postgres($pool) => $body,
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
    #[error("unsupported database URL {0:?}: use sqlite://FILE or postgres://USER@HOST/DB")]
    Unsupported(String),
}

/// Opens the database at `url` and its idempotency store (migrations applied).
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
    Err(DatabaseError::Unsupported(url.to_owned()))
}

/// `url` fit for a log line: a password in the user-info or in the query (`password`,
/// `sslpassword`, …) replaced by `***`. A URL that does not parse is not shown at all,
/// since it might hold a password where none is expected.
pub fn redact_url(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return "<unparseable database URL>".to_owned();
    };
    let mut redacted = false;
    if parsed.password().is_some() {
        // Only fails for URLs that cannot have a user-info, which then have no password.
        redacted = parsed.set_password(Some("***")).is_ok();
    }
    let secret = |name: &str| name.to_ascii_lowercase().contains("password");
    if parsed.query_pairs().any(|(name, _)| secret(&name)) {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(name, value)| {
                let value = if secret(&name) { "***".into() } else { value };
                (name.into_owned(), value.into_owned())
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
        redacted = true;
    }
    // Re-serialising may normalise an untouched URL; show it as given when nothing changed.
    if redacted {
        parsed.into()
    } else {
        url.to_owned()
    }
}

impl Database {
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
}
