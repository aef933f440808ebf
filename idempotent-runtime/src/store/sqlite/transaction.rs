//! Transactional handlers on SQLite (`Tx<Sqlite>`): the handler's writes and the
//! completion share one `BEGIN IMMEDIATE` transaction on the store's pool.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{Sqlite, SqliteConnection, SqlitePool};

use super::COMPLETE;
use crate::store::TxStore;
use crate::store::sql::bind_completion;
use crate::store::{FencingToken, StoreError, StoredResponse, TxSupport};

/// The [`TxSupport`] a [`SqliteStore`](super::SqliteStore) offers.
pub(super) fn support(pool: SqlitePool) -> TxSupport {
    TxSupport::new::<Sqlite>(Arc::new(SqliteTxStore { pool }))
}

/// The store's pool; the records live in its `idempotency_records` table.
#[derive(Debug)]
struct SqliteTxStore {
    pool: SqlitePool,
}

#[async_trait]
impl TxStore<Sqlite> for SqliteTxStore {
    /// `BEGIN IMMEDIATE`: the transaction takes the write lock at once (waiting up to the
    /// busy timeout for it). A deferred transaction that reads first holds a WAL snapshot,
    /// and its first write fails with `SQLITE_BUSY_SNAPSHOT` — without waiting — if any
    /// other connection (another request, this request's own heartbeat) committed since.
    async fn begin(&self) -> Result<sqlx::Transaction<'static, Sqlite>, StoreError> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
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
}
