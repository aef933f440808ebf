//! Transactional handlers on Postgres (`Tx<Postgres>`): the completion, and the steps an
//! atomic step records, run inside the handler's transaction, on the store's (possibly
//! schema-qualified) table.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{PgConnection, PgPool, Postgres};

use super::schema::Statements;
use super::{bind_record_step, describe_options};
use crate::store::TxStore;
use crate::store::sql::bind_completion;
use crate::store::{FencingToken, RecordedStep, StoreError, StoredResponse, TxSupport};

/// The [`TxSupport`] a [`PostgresStore`](super::PostgresStore) offers.
pub(super) fn support(pool: PgPool, sql: Arc<Statements>) -> TxSupport {
    TxSupport::new::<Postgres>(Arc::new(PgTxStore { pool, sql }))
}

/// The store's pool and its statements: the completion and steps need nothing else, so a
/// decorator store that forwards `transactions()` works exactly like the store.
struct PgTxStore {
    pool: PgPool,
    sql: Arc<Statements>,
}

impl std::fmt::Debug for PgTxStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTxStore")
            .field("location", &describe_options(&self.pool.connect_options()))
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl TxStore<Postgres> for PgTxStore {
    async fn record_step_in(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: &str,
        token: FencingToken,
        step: &RecordedStep,
    ) -> Result<bool, StoreError> {
        let done = bind_record_step(self.sql.record_step.clone(), scope, key, token, step)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn begin(&self) -> Result<sqlx::Transaction<'static, Postgres>, StoreError> {
        Ok(self.pool.begin().await?)
    }

    async fn complete_in(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: &str,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        let done = bind_completion(self.sql.complete.clone(), scope, key, token, response)?
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }
}
