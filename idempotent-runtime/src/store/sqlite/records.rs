//! [`SqliteRecords`]: the `idempotency_records` table as the fenced seam's register
//! ([`RecordStore`]); the protocol over it is [`Fenced`](crate::fenced::Fenced)'s, and
//! nothing here decides anything: an insert unless the key has a record, a read, a
//! compare-and-set on the record's version, a delete by version.
//!
//! Writes go through the store's one writer (`group_commit.rs`), which runs each as its
//! single statement in a batch of them; a write that changed nothing reads the record
//! back in the same call (an insert that found one, an update that found another
//! version), so a duplicate or a stale compare-and-set still costs one trip to the
//! writer. Reads go through the store's reader (`group_read.rs`). An insert reads
//! first: a key that has a record (a replay, a `409`, a `422`) is answered from that
//! read and never waits for SQLite's one write lock.
//!
//! Times are the store clock's (`lease_time.rs`): TTLs on its wall time, leases on the
//! boot's monotonic clock, which is the lease clock of [`StoreNow`] here.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::SqliteRow;
use sqlx::{Row as _, Sqlite, SqliteConnection, SqlitePool};
use tokio::sync::Semaphore;

use super::group_commit::{GroupCommit, Value, Write, WriteKind, Written};
use super::group_read::GroupRead;
use super::lease_time::Now;
use super::raw_connection::Row;
use super::writers::StoreWrites;
use crate::clock::{Clock, millis};
use crate::fingerprint::Fingerprint;
use crate::store::sql::{CompletionColumns, decode_completed};
use crate::store::{
    Capabilities, Change, ClaimRequest, FencingToken, Inserted, KeyedRecord, Record, RecordBody,
    RecordStore, StoreError, StoreNow, TxRecords, Updated,
};

/// How many records one write of a purge deletes: on a table whose key index is larger
/// than the cache, each dirties a page of it, so a slice holds the writer for a few
/// milliseconds at most.
const PURGE_SLICE: usize = 100;

/// The columns of a record, in the order [`record_at`] reads them.
macro_rules! record_columns {
    () => {
        "state, fingerprint, fingerprint_version, token, version, created_at, expires_at, \
         lease_expires_at, lease_boot_id, lease_ends_boot_ms, steps, status, headers, body"
    };
}

/// ?1 scope, ?2 key.
pub(super) static READ: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM idempotency_records WHERE scope = ?1 AND key = ?2"
);
/// ?1 wall now, ?2 limit.
const PAST_EXPIRY: &str = concat!(
    "SELECT scope, key, ",
    record_columns!(),
    " FROM idempotency_records WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2"
);
/// ?1 scope, ?2 key, then the claim's columns ([`claim_values`]).
static INSERT: &str = "INSERT INTO idempotency_records (scope, key, version, fingerprint, \
    fingerprint_version, token, created_at, expires_at, lease_expires_at, lease_boot_id, \
    lease_ends_boot_ms, state) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 'in_progress') \
    ON CONFLICT (scope, key) DO NOTHING";
/// ?1 scope, ?2 key, ?3 version.
static DELETE: &str =
    "DELETE FROM idempotency_records WHERE scope = ?1 AND key = ?2 AND version = ?3";

/// Each [`Change`] as one statement: ?1 scope, ?2 key, ?3 the version it must be at, ?4
/// the next, the change's own from ?5. A change of an in-progress record leaves a
/// completed one as it is but for its version, as
/// [`Record::changed`](crate::store::Record::changed) defines it.
static CLAIM: &str = "UPDATE idempotency_records SET version = ?4, fingerprint = ?5, \
    fingerprint_version = ?6, token = ?7, created_at = ?8, expires_at = ?9, \
    lease_expires_at = ?10, lease_boot_id = ?11, lease_ends_boot_ms = ?12, \
    state = 'in_progress', status = NULL, headers = NULL, body = NULL, \
    steps = CASE WHEN ?13 THEN steps END \
    WHERE scope = ?1 AND key = ?2 AND version = ?3";
static RENEW: &str = "UPDATE idempotency_records SET version = ?4, \
    lease_expires_at = CASE WHEN state = 'in_progress' THEN ?5 ELSE lease_expires_at END, \
    lease_boot_id = CASE WHEN state = 'in_progress' THEN ?6 ELSE lease_boot_id END, \
    lease_ends_boot_ms = CASE WHEN state = 'in_progress' THEN ?7 ELSE lease_ends_boot_ms END, \
    expires_at = CASE WHEN state = 'in_progress' THEN max(expires_at, ?8) ELSE expires_at END \
    WHERE scope = ?1 AND key = ?2 AND version = ?3";
/// `||` yields TEXT (its bytes unchanged, NUL and 0xFF included), which the CAST keeps a
/// BLOB: a STRICT BLOB column refuses TEXT.
static APPEND_STEP: &str = "UPDATE idempotency_records SET version = ?4, \
    steps = CASE WHEN state = 'in_progress' THEN CAST(coalesce(steps, X'') || ?5 AS BLOB) \
                 ELSE steps END \
    WHERE scope = ?1 AND key = ?2 AND version = ?3";
static COMPLETE: &str = "UPDATE idempotency_records SET version = ?4, state = 'completed', \
    lease_expires_at = NULL, lease_boot_id = NULL, lease_ends_boot_ms = NULL, \
    status = ?5, headers = ?6, body = ?7, steps = NULL \
    WHERE scope = ?1 AND key = ?2 AND version = ?3";
static END_LEASE: &str = "UPDATE idempotency_records SET version = ?4, \
    lease_expires_at = CASE WHEN state = 'in_progress' THEN ?5 ELSE lease_expires_at END, \
    lease_boot_id = CASE WHEN state = 'in_progress' THEN ?6 ELSE lease_boot_id END, \
    lease_ends_boot_ms = CASE WHEN state = 'in_progress' THEN ?7 ELSE lease_ends_boot_ms END, \
    token = CASE WHEN state = 'in_progress' THEN ?8 ELSE token END \
    WHERE scope = ?1 AND key = ?2 AND version = ?3";

/// The records of a [`SqliteStore`](super::SqliteStore). Cheap to clone; clones share
/// the pool, the writer and the reader.
#[derive(Debug, Clone)]
pub(super) struct SqliteRecords {
    pub(super) pool: SqlitePool,
    clock: Arc<dyn Clock>,
    /// The store's own writes in flight; transactional handlers let them go first.
    writes: Arc<StoreWrites>,
    /// The one writer every write goes through (group commit).
    pub(super) writer: GroupCommit,
    /// The one reader every read of a record goes through (group read).
    reader: GroupRead,
    /// SQLite has one writer, and `BEGIN IMMEDIATE` waits for the write lock holding a
    /// pooled connection: transactional requests queued there would take every
    /// connection, and every write of the app would time out with `503`. One transaction
    /// at a time per store (the others wait for this permit, holding nothing) leaves the
    /// rest of the pool to the store's own short writes.
    one_at_a_time: Arc<Semaphore>,
    /// How long a transactional handler may hold the write lock
    /// ([`SqliteStore::with_max_transaction_hold`](super::SqliteStore::with_max_transaction_hold)).
    pub(super) max_hold: Duration,
}

impl SqliteRecords {
    /// Starts the writer and the reader on the current Tokio runtime.
    pub(super) fn start(pool: SqlitePool, clock: Arc<dyn Clock>, max_hold: Duration) -> Self {
        let writes = Arc::new(StoreWrites::default());
        Self {
            writer: GroupCommit::start(pool.clone(), writes.clone()),
            reader: GroupRead::start(pool.clone()),
            pool,
            clock,
            writes,
            one_at_a_time: Arc::new(Semaphore::new(1)),
            max_hold,
        }
    }

    fn now(&self) -> Now {
        Now::of(self.clock.as_ref())
    }
}

/// The store's instant as the seam takes it: leases on the boot's clock (the wall clock
/// without a boot).
fn store_now(now: Now) -> StoreNow {
    StoreNow {
        wall_millis: now.wall,
        lease_millis: now.boot,
    }
}

#[async_trait]
impl RecordStore for SqliteRecords {
    async fn insert(&self, claim: &ClaimRequest<'_>) -> Result<Inserted, StoreError> {
        let (scope, key) = (claim.scope, claim.key);
        if let (Some(record), now) = self.reader.read(scope, key, &self.clock).await? {
            return Ok(Inserted::Exists(record, store_now(now)));
        }
        let now = self.now();
        let _write = self.writes.enter();
        // A record inserted by a racing claim may be deleted again (released, forgotten)
        // before this insert's read-back sees it (a write alone commits by itself): then
        // the key is free again.
        let write = Write::one(WriteKind::Claim, INSERT, insert_values(claim, now))
            .reading_back(self.clock.clone());
        Ok(match self.writer.write(write).await? {
            Written::Changed(_) => Inserted::Inserted,
            Written::Found(Some(record), now) => Inserted::Exists(record, store_now(now)),
            Written::Found(None, _) => Inserted::Gone,
        })
    }

    async fn read(&self, scope: &str, key: &str) -> Result<(Option<Record>, StoreNow), StoreError> {
        let (record, now) = self.reader.read(scope, key, &self.clock).await?;
        Ok((record, store_now(now)))
    }

    async fn update(
        &self,
        scope: &str,
        key: &str,
        version: u64,
        change: &Change<'_>,
    ) -> Result<Updated, StoreError> {
        let _write = self.writes.enter();
        let now = self.now();
        let (kind, statement, values) = update_values(scope, key, version, change, now)?;
        let write = Write::one(kind, statement, values).reading_back(self.clock.clone());
        Ok(match self.writer.write(write).await? {
            Written::Changed(_) => Updated::Updated(version.wrapping_add(1)),
            Written::Found(record, now) => Updated::Stale(record, store_now(now)),
        })
    }

    async fn delete(&self, scope: &str, key: &str, version: u64) -> Result<bool, StoreError> {
        let _write = self.writes.enter();
        let write = Write::one(
            WriteKind::Release,
            DELETE,
            delete_values(scope, key, version),
        );
        Ok(matches!(
            self.writer.write(write).await?,
            Written::Changed(1..)
        ))
    }

    async fn delete_many(&self, records: &[(&str, &str, u64)]) -> Result<u64, StoreError> {
        // The one writer serves the claims too: the deletes go in slices, each queued
        // behind the writes waiting by then, and after each the purge waits as long as
        // the slice took, so it never holds the write lock for long nor takes more than
        // half of the writer's time from the claims.
        let _write = self.writes.enter();
        let mut deleted = 0;
        let mut slices = records.chunks(PURGE_SLICE).peekable();
        while let Some(slice) = slices.next() {
            let started = tokio::time::Instant::now();
            let each = slice
                .iter()
                .map(|&(scope, key, version)| delete_values(scope, key, version))
                .collect();
            if let Written::Changed(rows) = self
                .writer
                .write(Write::each(WriteKind::Purge, DELETE, each))
                .await?
            {
                deleted += rows;
            }
            if slices.peek().is_some() {
                tokio::time::sleep(started.elapsed()).await;
            }
        }
        Ok(deleted)
    }

    async fn past_expiry(&self, limit: u32) -> Result<(Vec<KeyedRecord>, StoreNow), StoreError> {
        let now = self.now();
        let rows = sqlx::query(PAST_EXPIRY)
            .bind(now.wall)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        let records = rows
            .iter()
            .map(|row| {
                Ok(KeyedRecord {
                    scope: row.try_get(0)?,
                    key: row.try_get(1)?,
                    record: record_at(row, 2, now)?,
                })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok((records, store_now(now)))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none().with_clock(self.clock.clone())
    }
}

#[async_trait]
impl TxRecords<Sqlite> for SqliteRecords {
    /// `BEGIN IMMEDIATE`: the transaction takes the write lock at once (waiting up to the
    /// busy timeout for it). A deferred transaction that reads first holds a WAL snapshot,
    /// and its first write fails with `SQLITE_BUSY_SNAPSHOT` — without waiting — if any
    /// other connection (another request, this request's own heartbeat) committed since.
    async fn begin(&self) -> Result<sqlx::Transaction<'static, Sqlite>, StoreError> {
        self.writes.let_them_go_first().await;
        // The group-commit writer holds off its next batch until this returns.
        let _beginning = self.writes.beginning();
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    async fn read_in(
        &self,
        conn: &mut SqliteConnection,
        scope: &str,
        key: &str,
    ) -> Result<(Option<Record>, StoreNow), StoreError> {
        let now = self.now();
        let row = sqlx::query(READ)
            .bind(scope)
            .bind(key)
            .fetch_optional(&mut *conn)
            .await?;
        let record = row.map(|row| record_at(&row, 0, now)).transpose()?;
        Ok((record, store_now(now)))
    }

    async fn update_in(
        &self,
        conn: &mut SqliteConnection,
        scope: &str,
        key: &str,
        version: u64,
        change: &Change<'_>,
    ) -> Result<Updated, StoreError> {
        let now = self.now();
        let (_, statement, values) = update_values(scope, key, version, change, now)?;
        let mut query = sqlx::query(statement);
        for value in values {
            query = match value {
                Value::Text(text) => query.bind(text),
                Value::Blob(bytes) => query.bind(bytes),
                Value::Int(int) => query.bind(int),
                Value::Null => query.bind(None::<i64>),
            };
        }
        if query.execute(&mut *conn).await?.rows_affected() > 0 {
            return Ok(Updated::Updated(version.wrapping_add(1)));
        }
        let (record, now) = self.read_in(conn, scope, key).await?;
        Ok(Updated::Stale(record, now))
    }

    fn concurrency(&self) -> Option<Arc<Semaphore>> {
        Some(self.one_at_a_time.clone())
    }

    fn max_hold(&self) -> Option<Duration> {
        Some(self.max_hold)
    }
}

/// The parameters of [`INSERT`] for `claim` at `now`.
fn insert_values(claim: &ClaimRequest<'_>, now: Now) -> Vec<Value> {
    let mut values = vec![
        Value::Text(claim.scope.to_owned()),
        Value::Text(claim.key.to_owned()),
        version_value(Record::first_version(claim.token)),
    ];
    values.extend(claim_values(claim, now));
    values
}

/// A claim's columns, in the order of [`INSERT`] and [`CLAIM`]: fingerprint, its
/// version, token, created, expires, then the lease's.
fn claim_values(claim: &ClaimRequest<'_>, now: Now) -> impl Iterator<Item = Value> {
    [
        Value::Blob(claim.fingerprint.digest.to_vec()),
        Value::Int(i64::from(claim.fingerprint.version)),
        Value::Int(claim.token.0),
        Value::Int(now.wall),
        Value::Int(now.wall.saturating_add(millis(claim.ttl))),
    ]
    .into_iter()
    .chain(lease_values(now, claim.lease))
}

/// A lease of `lease` from `now`: its end on the wall clock, the boot, and its end on
/// that boot's clock (see `lease_time.rs`).
fn lease_values(now: Now, lease: Duration) -> [Value; 3] {
    [
        Value::Int(now.lease_expires_at(lease)),
        now.boot_id
            .map_or(Value::Null, |id| Value::Blob(id.to_vec())),
        now.lease_ends_boot(lease).map_or(Value::Null, Value::Int),
    ]
}

fn delete_values(scope: &str, key: &str, version: u64) -> Vec<Value> {
    vec![
        Value::Text(scope.to_owned()),
        Value::Text(key.to_owned()),
        version_value(version),
    ]
}

/// A version as the INTEGER column holds it: the same 64 bits.
fn version_value(version: u64) -> Value {
    Value::Int(i64::from_ne_bytes(version.to_ne_bytes()))
}

/// The statement applying `change` to the record at `version`, and its parameters.
fn update_values(
    scope: &str,
    key: &str,
    version: u64,
    change: &Change<'_>,
    now: Now,
) -> Result<(WriteKind, &'static str, Vec<Value>), StoreError> {
    let mut values = delete_values(scope, key, version);
    values.push(version_value(version.wrapping_add(1)));
    let (kind, statement) = match *change {
        Change::TakeOver { claim, keep_steps } => {
            values.extend(claim_values(claim, now));
            values.push(Value::Int(i64::from(keep_steps)));
            (WriteKind::TakeOver, CLAIM)
        }
        Change::Renew { lease, ttl } => {
            values.extend(lease_values(now, lease));
            values.push(Value::Int(now.wall.saturating_add(millis(ttl))));
            (WriteKind::Renew, RENEW)
        }
        Change::AppendStep(step) => {
            values.push(Value::Blob(step.to_vec()));
            (WriteKind::RecordStep, APPEND_STEP)
        }
        Change::Complete(response) => {
            let columns = CompletionColumns::of(response)?;
            values.extend([
                Value::Int(i64::from(columns.status)),
                Value::Blob(columns.headers),
                columns
                    .body
                    .map_or(Value::Null, |body| Value::Blob(body.to_vec())),
            ]);
            (WriteKind::Complete, COMPLETE)
        }
        Change::EndLease => {
            values.extend(lease_values(now, Duration::ZERO));
            values.push(Value::Int(FencingToken::RELEASED.0));
            (WriteKind::Release, END_LEASE)
        }
    };
    Ok((kind, statement, values))
}

/// A row's columns by position, however it was read: on the writer's or reader's own
/// handle, or through sqlx.
pub(super) trait Cells {
    /// An INTEGER column; `None` when NULL.
    fn int(&self, column: usize) -> Result<Option<i64>, StoreError>;
    /// A BLOB or TEXT column's bytes; `None` when NULL.
    fn bytes(&self, column: usize) -> Result<Option<Vec<u8>>, StoreError>;
}

impl Cells for Row<'_> {
    fn int(&self, column: usize) -> Result<Option<i64>, StoreError> {
        Ok(Row::int(self, column_index(column)?))
    }

    fn bytes(&self, column: usize) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(Row::bytes(self, column_index(column)?))
    }
}

fn column_index(column: usize) -> Result<std::ffi::c_int, StoreError> {
    std::ffi::c_int::try_from(column)
        .map_err(|_| StoreError::backend(format!("no column {column}")))
}

impl Cells for SqliteRow {
    fn int(&self, column: usize) -> Result<Option<i64>, StoreError> {
        Ok(self.try_get(column)?)
    }

    fn bytes(&self, column: usize) -> Result<Option<Vec<u8>>, StoreError> {
        // Unchecked: the state is TEXT, read as its bytes like every other column.
        Ok(self.try_get_unchecked(column)?)
    }
}

/// The record in the [`record_columns`] from column `first` of `row`, its lease on the
/// lease clock of `now` (see [`lease_end`]).
pub(super) fn record_at(row: &impl Cells, first: usize, now: Now) -> Result<Record, StoreError> {
    let int = |column: usize, name: &str| {
        row.int(first + column)?
            .ok_or_else(|| StoreError::Corrupt(format!("the record's {name} is NULL")))
    };
    let bytes = |column: usize| row.bytes(first + column);
    let state = bytes(0)?.unwrap_or_default();
    let digest = bytes(1)?.unwrap_or_default();
    let fingerprint = Fingerprint {
        version: i16::try_from(int(2, "fingerprint version")?)
            .map_err(|_| StoreError::Corrupt("a fingerprint version out of range".into()))?,
        digest: digest
            .try_into()
            .map_err(|_| StoreError::Corrupt("a fingerprint digest is not 32 bytes".into()))?,
    };
    let body = match &state[..] {
        b"in_progress" => RecordBody::InProgress {
            lease_expires_at: lease_end(int(7, "lease")?, bytes(8)?, row.int(first + 9)?, now),
            steps: bytes(10)?.map(bytes::Bytes::from).unwrap_or_default(),
        },
        b"completed" => RecordBody::Completed(decode_completed(
            row.int(first + 11)?,
            bytes(12)?,
            bytes(13)?,
        )?),
        other => {
            return Err(StoreError::Corrupt(format!(
                "unknown record state {:?}",
                String::from_utf8_lossy(other)
            )));
        }
    };
    Ok(Record {
        fingerprint,
        token: FencingToken(int(3, "token")?),
        version: u64::from_ne_bytes(int(4, "version")?.to_ne_bytes()),
        created_at: int(5, "creation")?,
        expires_at: int(6, "expiry")?,
        body,
    })
}

/// A stored lease's end on the lease clock of `now`: written in this boot, its end on
/// the boot's clock; written or read without a boot, as much after now as its wall-clock
/// end is after the wall's now; written in another boot, now: **a lease of another boot
/// has run out** (the host rebooted, so no handler of that boot still runs).
fn lease_end(wall_end: i64, boot_id: Option<Vec<u8>>, boot_end: Option<i64>, now: Now) -> i64 {
    match (boot_id, now.boot_id, boot_end) {
        (Some(written), Some(current), Some(end)) if written[..] == current[..] => end,
        (Some(_), Some(_), _) => now.boot,
        _ => now.boot.saturating_add(wall_end.saturating_sub(now.wall)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now(boot_id: Option<[u8; 16]>) -> Now {
        Now {
            wall: 1_000_000,
            boot_id,
            boot: if boot_id.is_some() { 5_000 } else { 1_000_000 },
        }
    }

    #[test]
    fn a_lease_of_this_boot_ends_on_its_clock() {
        let boot = [7; 16];
        assert_eq!(
            lease_end(1_000_500, Some(boot.to_vec()), Some(5_900), now(Some(boot))),
            5_900
        );
    }

    #[test]
    fn a_lease_of_another_boot_has_run_out() {
        let end = lease_end(
            9_000_000,
            Some(vec![1; 16]),
            Some(9_000),
            now(Some([2; 16])),
        );
        assert_eq!(end, 5_000, "no time left on this boot's clock");
    }

    #[test]
    fn a_lease_without_a_boot_keeps_its_time_left_on_the_wall_clock() {
        // Written before the boot clock (or by a clock without one), read with a boot.
        assert_eq!(lease_end(1_000_300, None, None, now(Some([2; 16]))), 5_300);
        // Written with a boot, read by a process that cannot read one.
        assert_eq!(
            lease_end(1_000_300, Some(vec![2; 16]), Some(1), now(None)),
            1_000_300
        );
    }
}
