//! Where a [`PostgresStore`](super::PostgresStore)'s records live: an optional schema,
//! and the store's statements with that table spliced in once.

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

/// A schema name checked to be a plain lower-case identifier, so it can be spliced into
/// SQL (always double-quoted) without any escaping question.
#[derive(Debug, Clone)]
pub(super) struct Schema(String);

impl Schema {
    pub(super) fn new(name: &str) -> Result<Self, String> {
        let mut chars = name.chars();
        let valid = name.len() <= 63
            && chars
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if valid {
            Ok(Self(name.to_owned()))
        } else {
            Err(format!(
                "invalid schema name {name:?}: use 1 to 63 lower-case ASCII letters, digits \
                 and underscores, not starting with a digit"
            ))
        }
    }

    pub(super) fn name(&self) -> &str {
        &self.0
    }

    pub(super) fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }
}

/// The store's statements (`sql/*.sql`), with its table name spliced in once.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) claim: SqlStr,
    pub(super) renew: SqlStr,
    pub(super) complete: SqlStr,
    pub(super) complete_batch: SqlStr,
    pub(super) release: SqlStr,
    pub(super) record_step: SqlStr,
    pub(super) purge: SqlStr,
    pub(super) inspect: SqlStr,
    pub(super) forget: SqlStr,
    pub(super) mark_waited: SqlStr,
}

impl Statements {
    pub(super) fn new(schema: Option<&Schema>) -> Self {
        let table = match schema {
            Some(s) => format!("{}.idempotency_records", s.quoted()),
            None => "idempotency_records".to_owned(),
        };
        let sql = |template: &str| AssertSqlSafe(template.replace("{t}", &table)).into_sql_str();
        Self {
            claim: sql(include_str!("sql/claim.sql")),
            renew: sql(include_str!("sql/renew.sql")),
            complete: sql(include_str!("sql/complete.sql")),
            complete_batch: sql(include_str!("sql/complete_batch.sql")),
            release: sql(include_str!("sql/release.sql")),
            record_step: sql(include_str!("sql/record_step.sql")),
            purge: sql(include_str!("sql/purge.sql")),
            inspect: sql(include_str!("sql/inspect.sql")),
            forget: sql(include_str!("sql/forget.sql")),
            mark_waited: sql(include_str!("sql/mark_waited.sql")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_schema_names() {
        for good in ["idem", "_x", "a1_b2", &"s".repeat(63)] {
            assert!(Schema::new(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "1abc",
            "Idem",
            "a-b",
            "a b",
            "a\"b",
            "ä",
            &"s".repeat(64),
        ] {
            assert!(Schema::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn splices_the_table_into_every_statement() {
        let schema = Schema::new("idem").unwrap();
        for statements in [Statements::new(None), Statements::new(Some(&schema))] {
            for sql in [
                &statements.claim,
                &statements.renew,
                &statements.complete,
                &statements.complete_batch,
                &statements.release,
                &statements.record_step,
                &statements.purge,
                &statements.inspect,
                &statements.forget,
                &statements.mark_waited,
            ] {
                assert!(!sql.as_str().contains("{t}"), "{}", sql.as_str());
            }
        }
        assert!(
            Statements::new(Some(&schema))
                .purge
                .as_str()
                .contains("\"idem\".idempotency_records")
        );
    }
}
