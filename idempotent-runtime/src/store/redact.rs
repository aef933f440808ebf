//! Store URLs in messages, with their passwords removed: one redaction for every store
//! (and for apps that log the URL they were given).

/// `url` fit for a log line or an error message, its secrets replaced by `***`: the
/// user-info password (`postgres://user:***@host/db`) and every secret query parameter
/// (`?password=***`, `sslpassword`, Redis' `pass`). A URL without secrets is returned as
/// given. `None` when it does not parse as a URL: it may still hold a password where no
/// parser can find it, so callers show a placeholder instead.
///
/// ```
/// use idempotent_runtime::store::redacted_url;
///
/// assert_eq!(
///     redacted_url("postgres://app:s3cret@db/pay?sslmode=require").as_deref(),
///     Some("postgres://app:***@db/pay?sslmode=require"),
/// );
/// assert_eq!(redacted_url("not a url"), None);
/// ```
pub fn redacted_url(raw: &str) -> Option<String> {
    let mut url = url::Url::parse(raw).ok()?;
    let mut redacted = false;
    if url.password().is_some() {
        // Only fails for URLs that cannot have credentials, which this one has.
        redacted = url.set_password(Some("***")).is_ok();
    }
    if url.query_pairs().any(|(name, _)| is_secret_param(&name)) {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(name, value)| {
                let value = if is_secret_param(&name) {
                    "***".into()
                } else {
                    value.into_owned()
                };
                (name.into_owned(), value)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
        redacted = true;
    }
    // Re-serialising may normalise an untouched URL: show it as given when nothing changed.
    Some(if redacted { url.into() } else { raw.to_owned() })
}

/// Whether a query parameter of a store URL holds a secret.
pub(crate) fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name.contains("password") || name == "pass"
}

/// A store URL for messages (see [`redacted_url`]), with a placeholder for one that does
/// not parse.
pub(crate) fn redact_url(raw: &str) -> String {
    redacted_url(raw).unwrap_or_else(|| "<a store URL that does not parse>".to_owned())
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://user:s3cr%40t@db.example:5432/app?sslmode=require"),
            "postgres://user:***@db.example:5432/app?sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://:pw@host/db"),
            "postgres://:***@host/db"
        );
        assert_eq!(
            redact_url("postgresql://user@host/db?password=hunter2&application_name=x"),
            "postgresql://user@host/db?password=***&application_name=x"
        );
        assert_eq!(
            redact_url("mysql://root@host/db?PassWord=hunter2"),
            "mysql://root@host/db?PassWord=***"
        );
        // Both at once.
        assert_eq!(
            redact_url("postgres://u:one@host/db?password=two"),
            "postgres://u:***@host/db?password=***"
        );
        // An `@` inside the password: the host starts after the last one.
        assert_eq!(redact_url("postgres://u:a@b@host"), "postgres://u:***@host");
        assert_eq!(
            redact_url("postgres://host:5432/db"),
            "postgres://host:5432/db"
        );
        assert_eq!(
            redact_url("postgres://user@host/db"),
            "postgres://user@host/db"
        );
        assert_eq!(
            redact_url("redis+unix:///run/redis.sock?db=1&pass=hunter2"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
    }

    #[test]
    fn hides_what_does_not_parse() {
        for raw in [
            "not a url",
            "postgres://u:secret@[bad/db",
            "redis://u:secret@host:port",
            "",
        ] {
            let shown = redact_url(raw);
            assert!(!shown.contains("secret"), "{shown}");
            assert_eq!(shown, "<a store URL that does not parse>");
        }
    }
}
