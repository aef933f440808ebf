//! Transactional handlers on SQLite (`Tx<Sqlite>`): the handler's writes, the steps it
//! records and the completion share one `BEGIN IMMEDIATE` transaction on the store's
//! pool.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::{Sqlite, SqliteConnection, SqlitePool};
use tokio::sync::Semaphore;

use super::writers::StoreWrites;
use super::{COMPLETE, RECORD_STEP};
use crate::store::TxStore;
use crate::store::sql::bind_completion;
use crate::store::{
    FencingToken, RecordedStep, StoreError, StoredResponse, TxSupport, encode_step,
};

/// The [`TxSupport`] a [`SqliteStore`](super::SqliteStore) offers.
pub(super) fn support(pool: SqlitePool, writes: Arc<StoreWrites>, max_hold: Duration) -> TxSupport {
    TxSupport::new::<Sqlite>(Arc::new(SqliteTxStore {
        pool,
        one_at_a_time: Arc::new(Semaphore::new(1)),
        writes,
        max_hold,
    }))
}

/// The store's pool; the records live in its `idempotency_records` table.
#[derive(Debug)]
struct SqliteTxStore {
    pool: SqlitePool,
    /// SQLite has one writer, and `BEGIN IMMEDIATE` waits for the write lock holding a
    /// pooled connection: transactional requests queued there would take every
    /// connection, and every claim, renewal and completion of the app — plain routes
    /// included — would time out with `503`. One transaction at a time per store (the
    /// others wait for this permit, holding nothing) leaves the rest of the pool to the
    /// store's own short writes.
    one_at_a_time: Arc<Semaphore>,
    /// The store's own writes in flight: a transaction lets them take the write lock
    /// first (see [`StoreWrites`]).
    writes: Arc<StoreWrites>,
    /// How long a transaction may hold the write lock
    /// ([`SqliteStore::with_max_transaction_hold`](super::SqliteStore::with_max_transaction_hold)).
    max_hold: Duration,
}

#[async_trait]
impl TxStore<Sqlite> for SqliteTxStore {
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

    fn concurrency(&self) -> Option<Arc<Semaphore>> {
        Some(self.one_at_a_time.clone())
    }

    fn max_hold(&self) -> Option<Duration> {
        Some(self.max_hold)
    }

    async fn complete_in(
        &self,
        conn: &mut SqliteConnection,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        let done = bind_completion(COMPLETE, scope, key, token, response)?
            .execute(conn)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// `record_step.sql` in the handler's transaction: the step commits with the
    /// handler's writes, or neither does.
    async fn record_step_in(
        &self,
        conn: &mut SqliteConnection,
        scope: &str,
        key: &str,
        token: FencingToken,
        step: &RecordedStep,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(RECORD_STEP)
            .bind(scope)
            .bind(key)
            .bind(token.0)
            .bind(encode_step(step))
            .execute(conn)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}
