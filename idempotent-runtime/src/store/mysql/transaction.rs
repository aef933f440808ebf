//! Transactional handlers on MySQL (`Tx<MySql>`): the handler's writes and the
//! completion, or a step's writes and its recording, share one InnoDB transaction on the
//! store's pool. Neither write is sent again on a lock conflict (`lock_conflict.rs`): a
//! deadlock rolls back the handler's whole transaction, so only the unit of work as a
//! whole can run again.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{MySql, MySqlConnection, MySqlPool};

use super::{
    completion, describe_options, record_step_refused_statement, record_step_statement,
    step_refused,
};
use crate::store::{
    FencingToken, RecordedStep, StoreError, StoredResponse, TxSupport, encode_step,
};
use crate::transaction::TxStore;

/// The [`TxSupport`] a [`MySqlStore`](super::MySqlStore) offers.
pub(super) fn support(pool: MySqlPool) -> TxSupport {
    TxSupport::new::<MySql>(Arc::new(MySqlTxStore { pool }))
}

/// The store's pool; the records live in its database's `idempotency_records` table.
struct MySqlTxStore {
    pool: MySqlPool,
}

impl std::fmt::Debug for MySqlTxStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlTxStore")
            .field("location", &describe_options(&self.pool.connect_options()))
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl TxStore<MySql> for MySqlTxStore {
    /// The same fenced append as `record_step`, on the handler's transaction: the step's
    /// writes and its record commit or roll back together.
    async fn record_step_in(
        &self,
        conn: &mut MySqlConnection,
        scope: &str,
        key: &str,
        token: FencingToken,
        step: &RecordedStep,
    ) -> Result<bool, StoreError> {
        let encoded = encode_step(step);
        let done = record_step_statement(scope, key, token, &encoded)
            .execute(&mut *conn)
            .await?;
        if done.rows_affected() == 1 {
            return Ok(true);
        }
        let row = record_step_refused_statement(scope, key, token)
            .fetch_optional(&mut *conn)
            .await?;
        step_refused(row, encoded.len())
    }

    /// A plain `BEGIN` at the session's isolation level (REPEATABLE READ by default). The
    /// completion is an `UPDATE`, which InnoDB runs on the newest committed row whatever
    /// the transaction's snapshot, so the token fence holds at any level.
    async fn begin(&self) -> Result<sqlx::Transaction<'static, MySql>, StoreError> {
        Ok(self.pool.begin().await?)
    }

    async fn complete_in(
        &self,
        conn: &mut MySqlConnection,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        let done = completion(scope, key, token, response)?
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }
}
