//! [`PgRecords`]: the idempotency records in one Postgres table, as a fenced record
//! register ([`RecordStore`]): insert-unless-present, read, compare-and-set on the
//! `version` column, delete-if-version (one record, or the sweeper's batch), the
//! sweeper's candidates. Each is one statement (`sql/`), one round trip, and answers with
//! the database's clock; the protocol's decisions are [`Fenced`](crate::fenced::Fenced)'s.
//! Inserts and completions outside a transaction share their statements with concurrent
//! ones (`group.rs`).
//!
//! **READ COMMITTED.** A statement reads the table as of its snapshot, taken when it
//! starts, while its `INSERT … ON CONFLICT` and `UPDATE … WHERE version` act on the newest
//! committed row. So an insert stopped by a record committed after the snapshot, or an
//! update missed because of a change committed after it, finds the snapshot silent (no
//! record) or showing the very version the update was given: the store then reads the
//! record with a statement of its own (a second round trip, only in that race).
//!
//! **Times.** Writes place times at the database's `now()` (the statement's start, each
//! operation being one autocommit statement); answers carry `clock_timestamp()`, taken
//! after the record they show was committed, so no record looks to have been written
//! after the instant it is judged at. Both clocks of a [`StoreNow`] are the database's.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::{PgArguments, PgConnection, PgPool};
use sqlx::query::Query;
use sqlx::{Postgres, Row, SqlStr};

use super::NotifiedWatch;
use super::connections::StatementConnections;
use super::group::{self, Batch, Batcher, element_of};
use super::notify::Notifier;
use super::schema::{Schema, Statements};
use crate::fingerprint::Fingerprint;
use crate::store::sql::batcher::Gathered;
use crate::store::sql::{CompletionColumns, from_column, now_of, record_of, to_column};
use crate::store::{
    Capabilities, Change, ClaimRequest, FencingToken, Inserted, KeyedRecord, Record, RecordStore,
    StoreError, StoreNow, TxRecords, Updated,
};

/// TTLs and leases are clamped to this (1000 years) so `now() + interval` stays inside
/// what `timestamptz` can represent.
const MAX_INTERVAL_MICROS: i64 = 1000 * 366 * 24 * 60 * 60 * 1_000_000;

/// The records of one table (see the module docs).
pub(super) struct PgRecords {
    pub(super) pool: PgPool,
    pub(super) schema: Option<Schema>,
    sql: Statements,
    /// Where the record operations run (`connections.rs`).
    connections: Arc<StatementConnections>,
    /// Wakes duplicates waiting for a claim to end (`LISTEN/NOTIFY`).
    notifier: Arc<Notifier>,
    /// Inserts, batched into shared statements (`group.rs`).
    inserts: Batcher<QueuedInsert>,
    /// Completions outside a transaction, batched likewise.
    completions: Batcher<QueuedCompletion>,
}

impl std::fmt::Debug for PgRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgRecords")
            .field("schema", &self.schema)
            .field("connections", &self.connections)
            .finish_non_exhaustive()
    }
}

impl PgRecords {
    pub(super) fn new(pool: PgPool, schema: Option<Schema>) -> Self {
        let sql = Statements::new(schema.as_ref());
        let notifier = Arc::new(Notifier::new((*pool.connect_options()).clone()));
        let connections = Arc::new(StatementConnections::like(&pool));
        let inserts = group::start(sql.insert.clone(), connections.clone());
        let completions = group::start(sql.complete_batch.clone(), connections.clone());
        Self {
            pool,
            schema,
            sql,
            connections,
            notifier,
            inserts,
            completions,
        }
    }

    /// The key's record on `conn`, and the database's clock.
    async fn read_on(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: &str,
    ) -> Result<(Option<Record>, StoreNow), StoreError> {
        let row = sqlx::query(self.sql.read.clone())
            .bind(scope)
            .bind(key)
            .fetch_one(conn)
            .await?;
        Ok((record_of(&row)?, now_of(&row)?))
    }

    /// [`RecordStore::update`] on `conn`.
    async fn update_on(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: &str,
        version: u64,
        change: &Change<'_>,
    ) -> Result<Updated, StoreError> {
        let row = self
            .update_query(scope, key, version, change)?
            .fetch_one(&mut *conn)
            .await?;
        if let Some(now_at) = row.try_get::<Option<i64>, _>("updated_version")? {
            return Ok(Updated::Updated(from_column(now_at)));
        }
        match record_of(&row)? {
            // Changed after the snapshot (see the module docs): read what it is now.
            Some(record) if record.version == version => {
                tracing::debug!(event = "store_reread", "record changed under an update");
                let (record, now) = self.read_on(conn, scope, key).await?;
                Ok(Updated::Stale(record, now))
            }
            record => Ok(Updated::Stale(record, now_of(&row)?)),
        }
    }

    /// `sql/update.sql` for `change`, its parameters bound.
    fn update_query<'q>(
        &self,
        scope: &'q str,
        key: &'q str,
        version: u64,
        change: &Change<'q>,
    ) -> Result<Query<'q, Postgres, PgArguments>, StoreError> {
        let cas = |sql: &sqlx::SqlStr| {
            sqlx::query(sql.clone())
                .bind(scope)
                .bind(key)
                .bind(to_column(version))
        };
        Ok(match *change {
            Change::TakeOver { claim, keep_steps } => cas(&self.sql.claim)
                .bind(&claim.fingerprint.digest[..])
                .bind(claim.fingerprint.version)
                .bind(claim.token.0)
                .bind(interval(claim.ttl))
                .bind(interval(claim.lease))
                .bind(keep_steps),
            Change::Renew { lease, ttl } => cas(&self.sql.renew)
                .bind(interval(lease))
                .bind(interval(ttl)),
            Change::AppendStep(step) => cas(&self.sql.append_step).bind(step),
            Change::Complete(response) => {
                let columns = CompletionColumns::of(response)?;
                cas(&self.sql.complete)
                    .bind(columns.status)
                    .bind(columns.headers)
                    .bind(columns.body)
            }
            Change::EndLease => cas(&self.sql.end_lease).bind(FencingToken::RELEASED.0),
        })
    }
}

#[async_trait]
impl RecordStore for PgRecords {
    async fn insert(&self, claim: &ClaimRequest<'_>) -> Result<Inserted, StoreError> {
        let (scope, key) = (claim.scope, claim.key);
        let queued = QueuedInsert {
            scope: scope.to_owned(),
            key: key.to_owned(),
            fingerprint: *claim.fingerprint,
            token: claim.token.0,
            ttl: interval(claim.ttl),
            lease: interval(claim.lease),
        };
        if let Some(inserted) = self.inserts.ask(queued).await? {
            return Ok(inserted);
        }
        // Committed after the snapshot (see the module docs): read it.
        tracing::debug!(event = "store_reread", "record inserted under an insert");
        Ok(match self.read(scope, key).await? {
            (Some(record), now) => Inserted::Exists(record, now),
            (None, _) => Inserted::Gone,
        })
    }

    async fn read(&self, scope: &str, key: &str) -> Result<(Option<Record>, StoreNow), StoreError> {
        let mut lent = self.connections.acquire().await?;
        let read = self.read_on(lent.connection(), scope, key).await?;
        lent.release();
        Ok(read)
    }

    async fn update(
        &self,
        scope: &str,
        key: &str,
        version: u64,
        change: &Change<'_>,
    ) -> Result<Updated, StoreError> {
        if let Change::Complete(response) = *change {
            let completion = QueuedCompletion::new(scope, key, version, response)?;
            if let Some(now_at) = self.completions.ask(completion).await? {
                return Ok(Updated::Updated(now_at));
            }
            let (record, now) = self.read(scope, key).await?;
            return Ok(Updated::Stale(record, now));
        }
        let mut lent = self.connections.acquire().await?;
        let updated = self
            .update_on(lent.connection(), scope, key, version, change)
            .await?;
        lent.release();
        Ok(updated)
    }

    async fn delete(&self, scope: &str, key: &str, version: u64) -> Result<bool, StoreError> {
        let mut lent = self.connections.acquire().await?;
        let done = sqlx::query(self.sql.delete.clone())
            .bind(scope)
            .bind(key)
            .bind(to_column(version))
            .execute(lent.connection())
            .await?;
        lent.release();
        Ok(done.rows_affected() == 1)
    }

    async fn delete_many(&self, records: &[(&str, &str, u64)]) -> Result<u64, StoreError> {
        let scopes: Vec<&str> = records.iter().map(|&(scope, ..)| scope).collect();
        let keys: Vec<&str> = records.iter().map(|&(_, key, _)| key).collect();
        let versions: Vec<i64> = records
            .iter()
            .map(|&(.., version)| to_column(version))
            .collect();
        let mut lent = self.connections.acquire().await?;
        let done = sqlx::query(self.sql.delete_many.clone())
            .bind(scopes)
            .bind(keys)
            .bind(versions)
            .execute(lent.connection())
            .await?;
        lent.release();
        Ok(done.rows_affected())
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
                    scope: row.try_get("scope")?,
                    key: row.try_get("key")?,
                    record,
                });
            }
        }
        let now = now.ok_or_else(|| StoreError::backend("the expiry scan answered no row"))?;
        Ok((past, now))
    }

    fn capabilities(&self) -> Capabilities {
        let watch = NotifiedWatch {
            notifier: self.notifier.clone(),
            connections: self.connections.clone(),
            mark: self.sql.mark_waited.clone(),
        };
        Capabilities::none().with_watch(Arc::new(watch))
    }
}

#[async_trait]
impl TxRecords<Postgres> for PgRecords {
    async fn begin(&self) -> Result<sqlx::Transaction<'static, Postgres>, StoreError> {
        Ok(self.pool.begin().await?)
    }

    async fn read_in(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: &str,
    ) -> Result<(Option<Record>, StoreNow), StoreError> {
        self.read_on(conn, scope, key).await
    }

    async fn update_in(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: &str,
        version: u64,
        change: &Change<'_>,
    ) -> Result<Updated, StoreError> {
        self.update_on(conn, scope, key, version, change).await
    }
}

/// One claim's insert, owned so it can wait for its batch.
struct QueuedInsert {
    scope: String,
    key: String,
    fingerprint: Fingerprint,
    token: i64,
    ttl: PgInterval,
    lease: PgInterval,
}

impl Gathered for QueuedInsert {
    type Record<'a> = (&'a str, &'a str);
    const ONE_PER_RECORD: bool = true;

    fn record(&self) -> Self::Record<'_> {
        (&self.scope, &self.key)
    }
}

impl Batch for QueuedInsert {
    /// `None`: stopped by a record the snapshot does not show (see the module docs).
    type Reply = Option<Inserted>;

    async fn run<'c>(
        statement: &'c SqlStr,
        db: &'c mut PgConnection,
        batch: &'c [&'c Self],
    ) -> Result<Vec<Result<Self::Reply, StoreError>>, sqlx::Error> {
        let rows = sqlx::query(statement.clone())
            .bind(batch.iter().map(|c| c.scope.as_str()).collect::<Vec<_>>())
            .bind(batch.iter().map(|c| c.key.as_str()).collect::<Vec<_>>())
            .bind(
                batch
                    .iter()
                    .map(|c| &c.fingerprint.digest[..])
                    .collect::<Vec<_>>(),
            )
            .bind(
                batch
                    .iter()
                    .map(|c| c.fingerprint.version)
                    .collect::<Vec<_>>(),
            )
            .bind(batch.iter().map(|c| c.token).collect::<Vec<_>>())
            .bind(
                batch
                    .iter()
                    .map(|c| to_column(Record::first_version(FencingToken(c.token))))
                    .collect::<Vec<_>>(),
            )
            .bind(batch.iter().map(|c| c.ttl).collect::<Vec<_>>())
            .bind(batch.iter().map(|c| c.lease).collect::<Vec<_>>())
            .fetch_all(db)
            .await?;
        let mut replies: Vec<Option<Result<Self::Reply, StoreError>>> =
            (0..batch.len()).map(|_| None).collect();
        for row in rows {
            let reply = if row.try_get::<bool, _>("inserted")? {
                Ok(Some(Inserted::Inserted))
            } else {
                record_of(&row).and_then(|record| match record {
                    Some(record) => Ok(Some(Inserted::Exists(record, now_of(&row)?))),
                    None => Ok(None),
                })
            };
            replies[element_of(&row, batch.len())?] = Some(reply);
        }
        replies
            .into_iter()
            .map(|reply| reply.ok_or_else(|| sqlx::Error::Protocol("an insert got no row".into())))
            .collect()
    }
}

/// One completion's compare-and-set, owned so it can wait for its batch.
struct QueuedCompletion {
    scope: String,
    key: String,
    version: i64,
    status: i16,
    headers: Vec<u8>,
    /// `None`: over the stored-response cap (`NULL`).
    body: Option<bytes::Bytes>,
}

impl QueuedCompletion {
    fn new(
        scope: &str,
        key: &str,
        version: u64,
        response: &crate::store::StoredResponse,
    ) -> Result<Self, StoreError> {
        let columns = CompletionColumns::of(response)?;
        Ok(Self {
            scope: scope.to_owned(),
            key: key.to_owned(),
            version: to_column(version),
            status: columns.status,
            headers: columns.headers,
            // Shared, not copied.
            body: response.body.clone(),
        })
    }
}

impl Gathered for QueuedCompletion {
    type Record<'a> = (&'a str, &'a str);
    const ONE_PER_RECORD: bool = true;

    fn record(&self) -> Self::Record<'_> {
        (&self.scope, &self.key)
    }

    fn bytes(&self) -> usize {
        self.headers.len() + self.body.as_ref().map_or(0, |body| body.len())
    }
}

impl Batch for QueuedCompletion {
    /// The record's version once completed; `None`: it was not at the version given.
    type Reply = Option<u64>;

    async fn run<'c>(
        statement: &'c SqlStr,
        db: &'c mut PgConnection,
        batch: &'c [&'c Self],
    ) -> Result<Vec<Result<Self::Reply, StoreError>>, sqlx::Error> {
        let rows = sqlx::query(statement.clone())
            .bind(batch.iter().map(|c| c.scope.as_str()).collect::<Vec<_>>())
            .bind(batch.iter().map(|c| c.key.as_str()).collect::<Vec<_>>())
            .bind(batch.iter().map(|c| c.version).collect::<Vec<_>>())
            .bind(batch.iter().map(|c| c.status).collect::<Vec<_>>())
            .bind(
                batch
                    .iter()
                    .map(|c| c.headers.as_slice())
                    .collect::<Vec<_>>(),
            )
            .bind(batch.iter().map(|c| c.body.as_deref()).collect::<Vec<_>>())
            .fetch_all(db)
            .await?;
        let mut applied = vec![None; batch.len()];
        for row in rows {
            applied[element_of(&row, batch.len())?] = Some(from_column(row.try_get("version")?));
        }
        Ok(applied.into_iter().map(Ok).collect())
    }
}

/// A `Duration` as a Postgres interval of whole microseconds, clamped (see
/// [`MAX_INTERVAL_MICROS`]).
fn interval(duration: Duration) -> PgInterval {
    let micros = i64::try_from(duration.as_micros()).unwrap_or(i64::MAX);
    PgInterval {
        months: 0,
        days: 0,
        microseconds: micros.min(MAX_INTERVAL_MICROS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamps_intervals() {
        assert_eq!(
            interval(Duration::from_millis(1500)).microseconds,
            1_500_000
        );
        assert_eq!(interval(Duration::MAX).microseconds, MAX_INTERVAL_MICROS);
    }
}
