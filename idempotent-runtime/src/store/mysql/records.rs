//! [`MySqlRecords`]: the idempotency records in one MySQL/MariaDB table, as a fenced record
//! register ([`RecordStore`]): insert-unless-present, read, compare-and-set on the
//! `version` column, delete-if-version, the sweeper's candidates. The protocol's decisions
//! are [`Fenced`](crate::fenced::Fenced)'s; the statements (`sql/`) only store.
//!
//! - **Insert**: one request of two statements, `INSERT IGNORE` then a read of the
//!   record (`sql/insert_batch.sql`), shared by concurrent inserts (group commit,
//!   `group_commit.rs`): a fresh key and a key that has a record cost one round trip
//!   each, and the existing record comes back with the database's clock.
//! - **Update**: one prepared `UPDATE … WHERE version = ?` (`sql/update.sql`). Only when
//!   it matched nothing does a read follow, to answer what the record is now (a second
//!   round trip, only when the owner's version was stale). Completions outside a
//!   transaction share one request and one transaction (`completion.rs`).
//! - **Delete** by version, **read**, **past expiry**: one prepared statement each. The
//!   sweeper's deletes: one statement per [`DELETE_BATCH`] records (`sql/delete_many.sql`).
//!
//! Every write outside a handler's transaction follows the one lock-conflict rule
//! (`lock_conflict.rs`): InnoDB rolled it back for a deadlock or a lock wait timeout, so
//! it is sent again, a few times at most.
//!
//! **Times.** Writes place times at the statement's `UTC_TIMESTAMP(6)`; answers carry the
//! database's clock as the row is produced ([`NOW`]), after the record it shows was
//! committed, so no record looks to have been written after the instant it is judged at. Both clocks of a
//! [`StoreNow`] are the database's, in whole milliseconds, as the record's times are.

use async_trait::async_trait;
use sqlx::mysql::{MySqlArguments, MySqlConnection, MySqlPool};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, MySql, Row, SqlSafeStr, SqlStr};

use super::completion::QueuedCompletion;
use super::group_commit::{self, Batcher, Value, inline, run_request};
use super::insert::QueuedInsert;
use super::lock_conflict::resend_on_lock_conflict;
use super::{micros, scope_key_sha256};
use crate::store::sql::{CompletionColumns, now_of, record_of, to_column};
use crate::store::{
    Change, ClaimRequest, FencingToken, Inserted, KeyedRecord, Record, RecordBody, RecordStore,
    StoreError, StoreNow, TxRecords, Updated,
};

/// The record columns a statement's row carries (`{record}` in `sql/`), times in whole
/// milliseconds since the epoch (the columns hold UTC).
const RECORD: &str = "r.state, r.fingerprint, r.fingerprint_version, r.token, r.version, \
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP('1970-01-01'), r.created_at) DIV 1000 \
        AS created_at_ms, \
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP('1970-01-01'), r.expires_at) DIV 1000 \
        AS expires_at_ms, \
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP('1970-01-01'), r.lease_expires_at) DIV 1000 \
        AS lease_expires_at_ms, \
    r.steps, r.status, r.headers, r.body";

/// The database's clock when the row is produced (`{now}` in `sql/`): the statement's
/// `UTC_TIMESTAMP(6)` moved on by the time the statement has run (`SYSDATE(6)` is when it
/// is evaluated, `NOW(6)` the start; both in the session's zone, so their difference is
/// not). `UTC_TIMESTAMP(6)` alone is when the request started, which for the insert's
/// read can precede the commit of a record it shows (the insert before it may have
/// waited for that record's lock): a lease would then look longer than it is.
const NOW: &str = "TIMESTAMPDIFF(MICROSECOND, TIMESTAMP('1970-01-01'), \
    UTC_TIMESTAMP(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6)) MICROSECOND) \
    DIV 1000 AS now_ms";

/// What each [`Change`] sets (`{set}` in `sql/update.sql`), exactly as
/// [`Record::changed`] defines it: a change of an in-progress record leaves a completed
/// one as it is. MySQL assigns left to right, each assignment seeing the ones before it,
/// so what reads the old `state` or `steps` comes first.
const CLAIM: &str = "steps = IF(? AND state = 'in_progress', steps, NULL), \
    fingerprint = ?, fingerprint_version = ?, state = 'in_progress', token = ?, \
    created_at = UTC_TIMESTAMP(6), expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, \
    lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, \
    status = NULL, headers = NULL, body = NULL";
const RENEW: &str = "\
    expires_at = IF(state = 'in_progress', \
                    GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), expires_at), \
    lease_expires_at = IF(state = 'in_progress', UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, \
                          lease_expires_at)";
const APPEND_STEP: &str =
    "steps = IF(state = 'in_progress', CONCAT(COALESCE(steps, X''), ?), steps)";
/// Past `max_allowed_packet` `CONCAT` yields `NULL`, which outside strict mode would be
/// stored silently, dropping every step: such an append matches nothing instead, and
/// [`MySqlRecords::stale`] tells it from a stale version.
const APPEND_STEP_FITS: &str = " AND COALESCE(LENGTH(steps), 0) + ? <= @@max_allowed_packet";
pub(super) const COMPLETE_SET: &str =
    "state = 'completed', status = ?, headers = ?, body = ?, steps = NULL";
const END_LEASE: &str = "\
    lease_expires_at = IF(state = 'in_progress', UTC_TIMESTAMP(6), lease_expires_at), \
    token = IF(state = 'in_progress', ?, token)";

/// The longest `scope` or `key` the schema's `BLOB` columns hold, in bytes. The insert is
/// an `INSERT IGNORE`, which would store a longer value cut short (with a warning)
/// instead of failing, so longer ones are refused before they are sent.
const MAX_COLUMN_BYTES: usize = 65_535;

/// How many records one statement of the sweeper's deletes names at most (a few hundred
/// bytes of text each).
const DELETE_BATCH: usize = 1000;

/// One record's condition in `sql/delete_many.sql`.
const DELETE_ONE: &str = "(scope_key_sha256 = ? AND scope = ? AND `key` = ? AND version = ?)";

/// The store's statements, spliced once.
#[derive(Debug)]
struct Statements {
    read: SqlStr,
    read_current: SqlStr,
    claim: SqlStr,
    renew: SqlStr,
    append_step: SqlStr,
    complete: SqlStr,
    end_lease: SqlStr,
    delete: SqlStr,
    past_expiry: SqlStr,
}

/// `template` with the record's columns and the clock spliced in.
pub(super) fn spliced(template: &str) -> String {
    template.replace("{record}", RECORD).replace("{now}", NOW)
}

/// `sql/update.sql` setting `set`, with the further condition `also`.
pub(super) fn update_statement(set: &str, also: &str) -> String {
    include_str!("sql/update.sql")
        .replace("{set}", set)
        .replace("{also}", also)
}

impl Statements {
    fn new() -> Self {
        let sql = |text: String| AssertSqlSafe(text).into_sql_str();
        let read = |lock: &str| sql(spliced(include_str!("sql/read.sql")).replace("{lock}", lock));
        let update = |set: &str, also: &str| sql(update_statement(set, also));
        Self {
            read: read(""),
            read_current: read("FOR UPDATE"),
            claim: update(CLAIM, ""),
            renew: update(RENEW, ""),
            append_step: update(APPEND_STEP, APPEND_STEP_FITS),
            complete: update(COMPLETE_SET, ""),
            end_lease: update(END_LEASE, ""),
            delete: sql(include_str!("sql/delete.sql").to_owned()),
            past_expiry: sql(spliced(include_str!("sql/past_expiry.sql"))),
        }
    }
}

/// The records of the `idempotency_records` table of the pool's database (see the module
/// docs).
pub(super) struct MySqlRecords {
    pub(super) pool: MySqlPool,
    sql: Statements,
    /// Inserts, batched into shared requests (`group_commit.rs`).
    inserts: Batcher<QueuedInsert>,
    /// Completions outside a transaction, batched likewise.
    completions: Batcher<QueuedCompletion>,
}

impl std::fmt::Debug for MySqlRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlRecords")
            .field(
                "location",
                &super::describe_options(&self.pool.connect_options()),
            )
            .finish_non_exhaustive()
    }
}

impl MySqlRecords {
    /// The records behind `pool`; the batchers are spawned on the current runtime.
    pub(super) fn new(pool: MySqlPool) -> Self {
        Self {
            inserts: group_commit::start(pool.clone()),
            completions: group_commit::start(pool.clone()),
            sql: Statements::new(),
            pool,
        }
    }

    /// `sql/read.sql` for the key, `current` with its locking form (see there).
    fn read_query<'q>(
        &self,
        scope: &'q str,
        key: &'q str,
        current: bool,
    ) -> Query<'q, MySql, MySqlArguments> {
        let sql = if current {
            &self.sql.read_current
        } else {
            &self.sql.read
        };
        sqlx::query(sql.clone())
            .bind(scope_key_sha256(scope, key))
            .bind(scope)
            .bind(key)
    }

    /// `sql/update.sql` for `change`, its parameters bound.
    fn update_query<'q>(
        &self,
        scope: &'q str,
        key: &'q str,
        version: u64,
        change: &Change<'q>,
    ) -> Result<Query<'q, MySql, MySqlArguments>, StoreError> {
        let query = match *change {
            Change::TakeOver { claim, keep_steps } => sqlx::query(self.sql.claim.clone())
                .bind(keep_steps)
                .bind(&claim.fingerprint.digest[..])
                .bind(claim.fingerprint.version)
                .bind(claim.token.0)
                .bind(micros(claim.ttl))
                .bind(micros(claim.lease)),
            Change::Renew { lease, ttl } => sqlx::query(self.sql.renew.clone())
                .bind(micros(ttl))
                .bind(micros(lease)),
            Change::AppendStep(step) => sqlx::query(self.sql.append_step.clone()).bind(step),
            Change::Complete(response) => {
                let columns = CompletionColumns::of(response)?;
                sqlx::query(self.sql.complete.clone())
                    .bind(columns.status)
                    .bind(columns.headers)
                    .bind(columns.body)
            }
            Change::EndLease => {
                sqlx::query(self.sql.end_lease.clone()).bind(FencingToken::RELEASED.0)
            }
        };
        let query = query
            .bind(scope_key_sha256(scope, key))
            .bind(scope)
            .bind(key)
            .bind(to_column(version));
        Ok(match *change {
            Change::AppendStep(step) => query.bind(i64::try_from(step.len()).unwrap_or(i64::MAX)),
            _ => query,
        })
    }

    /// The answer of an update of `version` that matched nothing, from the record as it
    /// is now (`read`): stale, unless it is still at `version`, which only an append past
    /// the server's `max_allowed_packet` leaves so; that is an error, not a lost record.
    fn stale(
        (record, now): (Option<Record>, StoreNow),
        version: u64,
        change: &Change<'_>,
    ) -> Result<Updated, StoreError> {
        match (&record, change) {
            (Some(found), Change::AppendStep(step)) if found.version == version => {
                let held = match &found.body {
                    RecordBody::InProgress { steps, .. } => steps.len(),
                    RecordBody::Completed(_) => 0,
                };
                Err(StoreError::backend(format!(
                    "a step of {} bytes would take the record's {held} bytes of steps past \
                     the server's max_allowed_packet",
                    step.len()
                )))
            }
            _ => Ok(Updated::Stale(record, now)),
        }
    }
}

/// Refuses a scope or key longer than its column holds (see [`MAX_COLUMN_BYTES`]).
fn check_lengths(scope: &str, key: &str) -> Result<(), StoreError> {
    for (what, value) in [("scope", scope), ("key", key)] {
        if value.len() > MAX_COLUMN_BYTES {
            return Err(StoreError::backend(std::io::Error::other(format!(
                "a {what} of {} bytes is longer than the MySQL store holds ({MAX_COLUMN_BYTES})",
                value.len()
            ))));
        }
    }
    Ok(())
}

#[async_trait]
impl RecordStore for MySqlRecords {
    async fn insert(&self, claim: &ClaimRequest<'_>) -> Result<Inserted, StoreError> {
        let (scope, key) = (claim.scope, claim.key);
        check_lengths(scope, key)?;
        let queued = QueuedInsert {
            id: scope_key_sha256(scope, key),
            scope: scope.to_owned(),
            key: key.to_owned(),
            fingerprint: *claim.fingerprint,
            token: claim.token,
            lease_micros: micros(claim.lease),
            ttl_micros: micros(claim.ttl),
        };
        Ok(self.inserts.ask(queued).await?.unwrap_or(Inserted::Gone))
    }

    async fn read(&self, scope: &str, key: &str) -> Result<(Option<Record>, StoreNow), StoreError> {
        let row = self
            .read_query(scope, key, false)
            .fetch_one(&self.pool)
            .await?;
        Ok((record_of(&row)?, now_of(&row)?))
    }

    async fn update(
        &self,
        scope: &str,
        key: &str,
        version: u64,
        change: &Change<'_>,
    ) -> Result<Updated, StoreError> {
        if let Change::Complete(response) = *change
            && let Some(completion) =
                QueuedCompletion::batchable((scope, key), to_column(version), response)?
        {
            // The batcher sends a batch again itself on a lock conflict.
            if self.completions.ask(completion).await? {
                return Ok(Updated::Updated(version.wrapping_add(1)));
            }
            return Self::stale(self.read(scope, key).await?, version, change);
        }
        let done = resend_on_lock_conflict("update", || async {
            let query = self.update_query(scope, key, version, change)?;
            Ok::<_, StoreError>(query.execute(&self.pool).await?)
        })
        .await?;
        if done.rows_affected() == 1 {
            return Ok(Updated::Updated(version.wrapping_add(1)));
        }
        Self::stale(self.read(scope, key).await?, version, change)
    }

    async fn delete(&self, scope: &str, key: &str, version: u64) -> Result<bool, StoreError> {
        let done = resend_on_lock_conflict("delete", || {
            sqlx::query(self.sql.delete.clone())
                .bind(scope_key_sha256(scope, key))
                .bind(scope)
                .bind(key)
                .bind(to_column(version))
                .execute(&self.pool)
        })
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_many(&self, records: &[(&str, &str, u64)]) -> Result<u64, StoreError> {
        let mut deleted = 0;
        for batch in records.chunks(DELETE_BATCH) {
            let ids: Vec<Vec<u8>> = batch
                .iter()
                .map(|&(scope, key, _)| scope_key_sha256(scope, key))
                .collect();
            let mut values = Vec::with_capacity(4 * batch.len());
            for (&(scope, key, version), id) in batch.iter().zip(&ids) {
                values.extend([
                    Value::Bytes(id),
                    Value::Bytes(scope.as_bytes()),
                    Value::Bytes(key.as_bytes()),
                    Value::Int(to_column(version)),
                ]);
            }
            let each = vec![DELETE_ONE; batch.len()].join(" OR ");
            // One text request, its values inlined: a prepared statement of each batch's
            // size would cost a round trip of its own to prepare.
            let statement = inline(
                &include_str!("sql/delete_many.sql").replace("{each}", &each),
                &values,
            );
            let results =
                resend_on_lock_conflict("delete", || run_request(&self.pool, statement.clone()))
                    .await?;
            deleted += results
                .iter()
                .filter_map(|result| result.as_ref().left())
                .map(|done| done.rows_affected())
                .sum::<u64>();
        }
        Ok(deleted)
    }

    async fn past_expiry(&self, limit: u32) -> Result<(Vec<KeyedRecord>, StoreNow), StoreError> {
        let rows = sqlx::query(self.sql.past_expiry.clone())
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        let mut past = Vec::with_capacity(rows.len());
        let mut now = None;
        for row in rows {
            now = Some(now_of(&row)?);
            if let Some(record) = record_of(&row)? {
                past.push(KeyedRecord {
                    scope: text(row.try_get("scope")?)?,
                    key: text(row.try_get("key")?)?,
                    record,
                });
            }
        }
        let now = now.ok_or_else(|| StoreError::backend("the expiry scan answered no row"))?;
        Ok((past, now))
    }
}

/// Inside a handler's transaction no write is sent again on a lock conflict: InnoDB
/// rolled back the whole transaction, the handler's own writes with it, so only the unit
/// of work as a whole can run again.
#[async_trait]
impl TxRecords<MySql> for MySqlRecords {
    /// A plain `BEGIN` at the session's isolation level (REPEATABLE READ by default): the
    /// compare-and-set is an `UPDATE` and the read a locking one, which both act on the
    /// newest committed row whatever the transaction's snapshot.
    async fn begin(&self) -> Result<sqlx::Transaction<'static, MySql>, StoreError> {
        Ok(self.pool.begin().await?)
    }

    async fn read_in(
        &self,
        conn: &mut MySqlConnection,
        scope: &str,
        key: &str,
    ) -> Result<(Option<Record>, StoreNow), StoreError> {
        let row = self.read_query(scope, key, true).fetch_one(conn).await?;
        Ok((record_of(&row)?, now_of(&row)?))
    }

    async fn update_in(
        &self,
        conn: &mut MySqlConnection,
        scope: &str,
        key: &str,
        version: u64,
        change: &Change<'_>,
    ) -> Result<Updated, StoreError> {
        let done = self
            .update_query(scope, key, version, change)?
            .execute(&mut *conn)
            .await?;
        if done.rows_affected() == 1 {
            return Ok(Updated::Updated(version.wrapping_add(1)));
        }
        let now = self.read_in(conn, scope, key).await?;
        Self::stale(now, version, change)
    }
}

/// A `BLOB` column's text (scopes and keys are stored as their UTF-8 bytes).
fn text(bytes: Vec<u8>) -> Result<String, StoreError> {
    String::from_utf8(bytes).map_err(|_| StoreError::Corrupt("a scope or key is not UTF-8".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_has_its_parameters_spliced() {
        let sql = Statements::new();
        for statement in [
            &sql.read,
            &sql.read_current,
            &sql.claim,
            &sql.renew,
            &sql.append_step,
            &sql.complete,
            &sql.end_lease,
            &sql.delete,
            &sql.past_expiry,
        ] {
            let text = statement.as_str();
            assert!(!text.contains('{'), "{text}");
        }
    }
}
