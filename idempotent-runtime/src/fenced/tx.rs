//! Transactional handlers over the seam: a [`TxRecords`](crate::store::TxRecords) register offers its read and
//! compare-and-set on a handler's connection, and [`Fenced::transactions`] turns it into
//! the [`TxStore`] the engine runs `Tx<DB>` handlers with. The completion and an atomic
//! step inside the transaction are then the same owner's write as outside it (one
//! compare-and-set on the version [`Fenced`] remembers for the token), so a takeover
//! that committed first makes them stale and the engine rolls the handler back.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{Access, Fenced, Owned, owner_writes};
use crate::store::{
    Change, FencingToken, Record, RecordStore, RecordedStep, StoreError, StoreNow, StoredResponse,
    TxDatabase, TxRecords, TxStore, TxSupport, Updated, encode_step,
};

impl<R: RecordStore> Fenced<R> {
    /// What transactional handlers on `DB` need: a [`TxSupport`] whose writes are the
    /// owner's compare-and-sets on the handler's connection, sharing this value's
    /// versions by token.
    pub fn transactions<DB: TxDatabase>(&self) -> TxSupport
    where
        R: TxRecords<DB>,
    {
        TxSupport::new::<DB>(Arc::new(FencedTx {
            records: self.records.clone(),
            owned: self.owned.clone(),
        }))
    }
}

/// The [`TxStore`] of [`Fenced::transactions`].
struct FencedTx<R> {
    records: Arc<R>,
    owned: Arc<Owned>,
}

impl<R: std::fmt::Debug> std::fmt::Debug for FencedTx<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedTx")
            .field("records", &self.records)
            .finish_non_exhaustive()
    }
}

/// The records, on a handler's connection.
struct InTx<'c, R, DB: TxDatabase> {
    records: &'c R,
    conn: &'c mut DB::Connection,
}

impl<R: TxRecords<DB>, DB: TxDatabase> Access for InTx<'_, R, DB> {
    fn read<'a>(
        &'a mut self,
        scope: &'a str,
        key: &'a str,
    ) -> impl Future<Output = Result<(Option<Record>, StoreNow), StoreError>> + Send + 'a {
        self.records.read_in(self.conn, scope, key)
    }

    fn update<'a>(
        &'a mut self,
        scope: &'a str,
        key: &'a str,
        version: u64,
        change: &'a Change<'a>,
    ) -> impl Future<Output = Result<Updated, StoreError>> + Send + 'a {
        self.records
            .update_in(self.conn, scope, key, version, change)
    }
}

#[async_trait]
impl<DB: TxDatabase, R: TxRecords<DB>> TxStore<DB> for FencedTx<R> {
    async fn begin(&self) -> Result<sqlx::Transaction<'static, DB>, StoreError> {
        self.records.begin().await
    }

    async fn complete_in(
        &self,
        conn: &mut DB::Connection,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        let mut access = InTx::<R, DB> {
            records: &self.records,
            conn,
        };
        let change = Change::Complete(response);
        owner_writes(&self.owned, &mut access, (scope, key), token, &change).await
    }

    async fn record_step_in(
        &self,
        conn: &mut DB::Connection,
        scope: &str,
        key: &str,
        token: FencingToken,
        step: &RecordedStep,
    ) -> Result<bool, StoreError> {
        let step = encode_step(step);
        let mut access = InTx::<R, DB> {
            records: &self.records,
            conn,
        };
        let change = Change::AppendStep(&step);
        owner_writes(&self.owned, &mut access, (scope, key), token, &change).await
    }

    fn concurrency(&self) -> Option<Arc<tokio::sync::Semaphore>> {
        self.records.concurrency()
    }

    fn max_hold(&self) -> Option<Duration> {
        self.records.max_hold()
    }
}
