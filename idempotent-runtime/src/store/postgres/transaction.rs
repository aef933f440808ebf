//! Transactional handlers on Postgres (`Tx<Postgres>`): the completion runs inside the
//! handler's transaction, on the store's (possibly schema-qualified) table.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{PgConnection, PgPool, Postgres};

use super::describe_options;
use super::schema::Statements;
use crate::store::TxStore;
use crate::store::sql::bind_completion;
use crate::store::{FencingToken, StoreError, StoredResponse, TxSupport};

/// The [`TxSupport`] a [`PostgresStore`](super::PostgresStore) offers.
pub(super) fn support(pool: PgPool, sql: Arc<Statements>) -> TxSupport {
    TxSupport::new::<Postgres>(Arc::new(PgTxStore { pool, sql }))
}

/// The store's pool and its statements: the completion needs nothing else, so a
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
        _conn: &mut <Postgres as sqlx::Database>::Connection,
        _scope: &str,
        _key: &str,
        _token: crate::store::FencingToken,
        _step: &crate::store::RecordedStep,
    ) -> Result<bool, StoreError> {
        // WIP(steps): replaced by this store's implementation before the issue closes.
        Err(StoreError::backend(
            "recording steps is not implemented on this store yet",
        ))
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
