//! Database URLs in messages, with their passwords removed.

/// `url` with every password replaced by `***`: the user-info password
/// (`postgres://user:***@host/db`) and any `password` query parameter
/// (`?password=***`, as libpq and sqlx accept it). A string that does not parse as a URL
/// is not shown at all: it may still hold a password.
pub(crate) fn redact_url(raw: &str) -> String {
    let Ok(mut url) = url::Url::parse(raw) else {
        return "<a database URL that does not parse>".to_owned();
    };
    if url.password().is_some() {
        // Only fails for URLs that cannot have credentials, which this one has.
        let _ = url.set_password(Some("***"));
    }
    let has_password_param = url
        .query_pairs()
        .any(|(name, _)| name.eq_ignore_ascii_case("password"));
    if has_password_param {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(name, value)| {
                let value = if name.eq_ignore_ascii_case("password") {
                    "***".into()
                } else {
                    value.into_owned()
                };
                (name.into_owned(), value)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.into()
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
    }

    #[test]
    fn hides_what_does_not_parse() {
        for raw in ["not a url", "postgres://u:secret@[bad/db", ""] {
            let shown = redact_url(raw);
            assert!(!shown.contains("secret"), "{shown}");
            assert_eq!(shown, "<a database URL that does not parse>");
        }
    }
}
