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

/// The columns of a record, as `record_of` (`records.rs`) reads them, of a table aliased
/// `r`; all NULL when there is none. Times in milliseconds since the epoch, rounded down.
const RECORD: &str = "r.state, r.fingerprint, r.fingerprint_version, r.token, r.version, \
    floor(extract(epoch FROM r.created_at) * 1000)::bigint AS created_at_ms, \
    floor(extract(epoch FROM r.expires_at) * 1000)::bigint AS expires_at_ms, \
    floor(extract(epoch FROM r.lease_expires_at) * 1000)::bigint AS lease_expires_at_ms, \
    r.steps, r.status, r.headers, r.body";

/// The database's clock when the row is produced (see `records.rs`).
const NOW: &str = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms";

/// What each [`Change`](crate::store::Change) sets (`{set}` in `sql/update.sql`, whose
/// parameters it continues from `$4`), exactly as
/// [`Record::changed`](crate::store::Record::changed) defines it: a change of an
/// in-progress record leaves a completed one as it is. `waited` is the watch's, not the
/// record's: ending the lease clears it, which notifies the waiters (migration 4).
const CLAIM: &str = "fingerprint = $4, fingerprint_version = $5, state = 'in_progress', \
    token = $6, created_at = now(), expires_at = now() + $7, lease_expires_at = now() + $8, \
    status = NULL, headers = NULL, body = NULL, \
    steps = CASE WHEN $9 AND state = 'in_progress' THEN steps END";
const RENEW: &str = "\
    lease_expires_at = CASE WHEN state = 'in_progress' THEN now() + $4 \
                            ELSE lease_expires_at END, \
    expires_at = CASE WHEN state = 'in_progress' THEN greatest(expires_at, now() + $5) \
                      ELSE expires_at END";
const APPEND_STEP: &str = "\
    steps = CASE WHEN state = 'in_progress' THEN coalesce(steps, ''::bytea) || $4 ELSE steps END";
/// A completion alone, inside a handler's transaction, on the app's pool whose
/// connections may hold a generic plan (see `connections.rs`): the batched completions of
/// `sql/complete.sql` set the same.
const COMPLETE: &str = "state = 'completed', status = $4, headers = $5, body = $6, steps = NULL";
const END_LEASE: &str = "\
    lease_expires_at = CASE WHEN state = 'in_progress' THEN now() ELSE lease_expires_at END, \
    token = CASE WHEN state = 'in_progress' THEN $4 ELSE token END, \
    waited = waited AND state <> 'in_progress'";

/// The store's statements (`sql/*.sql`), with its table name spliced in once.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) insert: SqlStr,
    pub(super) read: SqlStr,
    pub(super) claim: SqlStr,
    pub(super) renew: SqlStr,
    pub(super) append_step: SqlStr,
    pub(super) complete: SqlStr,
    pub(super) complete_batch: SqlStr,
    pub(super) end_lease: SqlStr,
    pub(super) delete: SqlStr,
    pub(super) delete_many: SqlStr,
    pub(super) past_expiry: SqlStr,
    pub(super) mark_waited: SqlStr,
}

impl Statements {
    pub(super) fn new(schema: Option<&Schema>) -> Self {
        let table = match schema {
            Some(s) => format!("{}.idempotency_records", s.quoted()),
            None => "idempotency_records".to_owned(),
        };
        let sql = |template: &str| {
            let spliced = template
                .replace("{t}", &table)
                .replace("{record}", RECORD)
                .replace("{now}", NOW);
            AssertSqlSafe(spliced).into_sql_str()
        };
        let update = |set: &str| sql(&include_str!("sql/update.sql").replace("{set}", set));
        Self {
            insert: sql(include_str!("sql/insert.sql")),
            read: sql(include_str!("sql/read.sql")),
            claim: update(CLAIM),
            renew: update(RENEW),
            append_step: update(APPEND_STEP),
            complete: update(COMPLETE),
            complete_batch: sql(include_str!("sql/complete.sql")),
            end_lease: update(END_LEASE),
            delete: sql(include_str!("sql/delete.sql")),
            delete_many: sql(include_str!("sql/delete_many.sql")),
            past_expiry: sql(include_str!("sql/past_expiry.sql")),
            mark_waited: sql(include_str!("sql/mark_waited.sql")),
        }
    }

    #[cfg(test)]
    fn all(&self) -> [&SqlStr; 12] {
        [
            &self.insert,
            &self.read,
            &self.claim,
            &self.renew,
            &self.append_step,
            &self.complete,
            &self.complete_batch,
            &self.end_lease,
            &self.delete,
            &self.delete_many,
            &self.past_expiry,
            &self.mark_waited,
        ]
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
    fn splices_every_placeholder_into_every_statement() {
        let schema = Schema::new("idem").unwrap();
        for statements in [Statements::new(None), Statements::new(Some(&schema))] {
            for sql in statements.all() {
                assert!(!sql.as_str().contains('{'), "{}", sql.as_str());
            }
        }
        assert!(
            Statements::new(Some(&schema))
                .delete
                .as_str()
                .contains("\"idem\".idempotency_records")
        );
    }
}
