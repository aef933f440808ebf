//! The MySQL completion outside a transaction: a whole batch of completions in one
//! request and one transaction (`sql/complete_batch.sql`, group commit,
//! `group_commit.rs`), each its own `Complete` compare-and-set on the record's version
//! (`sql/update.sql`, as `records.rs` sends it alone).

use sqlx::Either;
use sqlx::mysql::MySqlConnection;

use super::group_commit::{Answer, Batch, MAX_BATCH_BYTES, Value, inline, run_request};
use super::records::{COMPLETE_SET, update_statement};
use super::scope_key_sha256;
use crate::store::sql::CompletionColumns;
use crate::store::sql::batcher::Gathered;
use crate::store::{StoreError, StoredResponse};

const COMPLETE_BATCH: &str = include_str!("sql/complete_batch.sql");

/// One completion, owned so it can wait for its batch.
pub(super) struct QueuedCompletion {
    id: Vec<u8>,
    scope: String,
    key: String,
    /// The version the completion compares, as the column holds it.
    version: i64,
    status: i16,
    headers: Vec<u8>,
    /// `None`: over the stored-response cap (`NULL`).
    body: Option<bytes::Bytes>,
}

impl QueuedCompletion {
    /// The completion of the record of `(scope, key)` at `version` (as the column holds
    /// it), recording `response`; `None` when the response is too large to travel in a batch's text
    /// (more than [`MAX_BATCH_BYTES`]): it then runs as a statement of its own, its
    /// values sent as parameters.
    pub(super) fn batchable(
        (scope, key): (&str, &str),
        version: i64,
        response: &StoredResponse,
    ) -> Result<Option<Self>, StoreError> {
        let columns = CompletionColumns::of(response)?;
        let completion = Self {
            id: scope_key_sha256(scope, key),
            scope: scope.to_owned(),
            key: key.to_owned(),
            version,
            status: columns.status,
            headers: columns.headers,
            // Shared, not copied.
            body: response.body.clone(),
        };
        Ok((completion.bytes() <= MAX_BATCH_BYTES).then_some(completion))
    }
}

impl Gathered for QueuedCompletion {
    type Record<'a> = &'a [u8];
    const ONE_PER_RECORD: bool = false;

    fn record(&self) -> Self::Record<'_> {
        &self.id
    }

    fn bytes(&self) -> usize {
        self.headers.len() + self.body.as_ref().map_or(0, |body| body.len())
    }
}

impl Batch for QueuedCompletion {
    /// Whether the completion took effect (the record was at its version).
    type Reply = bool;

    async fn run<'c>(
        db: &'c mut MySqlConnection,
        batch: &'c [&'c Self],
    ) -> Result<Vec<Answer<Self>>, sqlx::Error> {
        let complete = update_statement(COMPLETE_SET, "");
        let mut updates = String::new();
        for completion in batch {
            let body = completion.body.as_deref().map_or(Value::Null, Value::Bytes);
            updates.push_str(&inline(
                &complete,
                &[
                    Value::Int(i64::from(completion.status)),
                    Value::Bytes(&completion.headers),
                    body,
                    Value::Bytes(&completion.id),
                    Value::Bytes(completion.scope.as_bytes()),
                    Value::Bytes(completion.key.as_bytes()),
                    Value::Int(completion.version),
                ],
            ));
            updates.push_str(";\n");
        }
        let statement = COMPLETE_BATCH.replace("{completions}", &updates);
        let results = run_request(db, statement).await?;
        // One result per statement: START TRANSACTION, one per UPDATE, COMMIT. Rows
        // *matched* (sqlx connects with CLIENT_FOUND_ROWS).
        let counts: Vec<u64> = results
            .iter()
            .filter_map(|result| match result {
                Either::Left(done) => Some(done.rows_affected()),
                Either::Right(_) => None,
            })
            .collect();
        if counts.len() != batch.len() + 2 {
            return Err(sqlx::Error::Protocol(format!(
                "a batch of {} completions got {} results",
                batch.len(),
                counts.len()
            )));
        }
        Ok(counts[1..=batch.len()]
            .iter()
            .map(|&matched| Ok(matched == 1))
            .collect())
    }
}
