//! The Postgres completion outside a transaction: one statement
//! (`sql/complete_batch.sql`) for a whole batch of completions (group commit,
//! `group_commit.rs`), each fenced by its token.

use sqlx::SqlStr;
use sqlx::postgres::PgConnection;

use super::group_commit::{Batch, element_of};
use crate::store::sql::CompletionColumns;
use crate::store::{FencingToken, StoreError, StoredResponse};

/// One completion, owned so it can wait for its batch.
pub(super) struct QueuedCompletion {
    scope: String,
    key: String,
    token: FencingToken,
    status: i16,
    headers: Vec<u8>,
    /// `None`: over the stored-response cap (`NULL`).
    body: Option<bytes::Bytes>,
}

impl QueuedCompletion {
    /// The completion of the claim `token` holds on `(scope, key)`, recording `response`.
    pub(super) fn new(
        (scope, key): (&str, &str),
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<Self, StoreError> {
        let columns = CompletionColumns::of(response)?;
        Ok(Self {
            scope: scope.to_owned(),
            key: key.to_owned(),
            token,
            status: columns.status,
            headers: columns.headers,
            // Shared, not copied.
            body: response.body.clone(),
        })
    }
}

impl Batch for QueuedCompletion {
    /// Whether the completion took effect.
    type Reply = bool;

    fn record(&self) -> (&str, &str) {
        (&self.scope, &self.key)
    }

    fn bytes(&self) -> usize {
        self.headers.len() + self.body.as_ref().map_or(0, |body| body.len())
    }

    fn after_first(&self, _: &Self, _: &bool) -> Option<bool> {
        // Two completions of one record: at most one holds its claim; the other runs in
        // the next batch, after this one's effect.
        None
    }

    async fn run<'c>(
        statement: &'c SqlStr,
        db: &'c mut PgConnection,
        batch: &'c [&'c Self],
    ) -> Result<Vec<Result<bool, StoreError>>, sqlx::Error> {
        let scopes: Vec<&str> = batch.iter().map(|c| c.scope.as_str()).collect();
        let keys: Vec<&str> = batch.iter().map(|c| c.key.as_str()).collect();
        let tokens: Vec<i64> = batch.iter().map(|c| c.token.0).collect();
        let statuses: Vec<i16> = batch.iter().map(|c| c.status).collect();
        let headers: Vec<&[u8]> = batch.iter().map(|c| c.headers.as_slice()).collect();
        let bodies: Vec<Option<&[u8]>> = batch.iter().map(|c| c.body.as_deref()).collect();
        let rows = sqlx::query(statement.clone())
            .bind(scopes)
            .bind(keys)
            .bind(tokens)
            .bind(statuses)
            .bind(headers)
            .bind(bodies)
            .fetch_all(db)
            .await?;
        let mut done = vec![false; batch.len()];
        for row in rows {
            done[element_of(&row, batch.len())?] = true;
        }
        Ok(done.into_iter().map(Ok).collect())
    }
}
