//! The MySQL insert, for a whole batch of claims in one request (group commit,
//! `group_commit.rs`): insert the record of every key that has none and read back every
//! claim's record with the database's clock (`sql/insert_batch.sql`). A record holding
//! the claim's token is the one it inserted; any other is answered as found, for the
//! engine to decide on.

use sqlx::mysql::MySqlConnection;
use sqlx::{Either, Row};

use super::group_commit::{Answer, Batch, Value, inline, run_request};
use super::records::spliced;
use crate::fingerprint::Fingerprint;
use crate::store::sql::batcher::Gathered;
use crate::store::sql::{now_of, record_of, to_column};
use crate::store::{FencingToken, Inserted, Record, StoreError};

/// One claim's insert, owned so it can wait for its batch.
pub(super) struct QueuedInsert {
    pub(super) id: Vec<u8>,
    pub(super) scope: String,
    pub(super) key: String,
    pub(super) fingerprint: Fingerprint,
    pub(super) token: FencingToken,
    pub(super) lease_micros: i64,
    pub(super) ttl_micros: i64,
}

impl Gathered for QueuedInsert {
    type Record<'a> = &'a [u8];
    const ONE_PER_RECORD: bool = false;

    fn record(&self) -> Self::Record<'_> {
        &self.id
    }
}

impl Batch for QueuedInsert {
    /// `None`: no record after the insert (deleted in between: [`Inserted::Gone`]).
    type Reply = Option<Inserted>;

    async fn run<'c>(
        db: &'c mut MySqlConnection,
        batch: &'c [&'c Self],
    ) -> Result<Vec<Answer<Self>>, sqlx::Error> {
        // Each claim's values, in the order the two templates take them.
        let (rows, elements): (Vec<String>, Vec<String>) = batch
            .iter()
            .enumerate()
            .map(|(n, claim)| {
                let (id, scope, key) = (
                    Value::Bytes(&claim.id),
                    Value::Bytes(claim.scope.as_bytes()),
                    Value::Bytes(claim.key.as_bytes()),
                );
                let token = Value::Int(claim.token.0);
                let version = Value::Int(to_column(Record::first_version(claim.token)));
                let row = [
                    id,
                    scope,
                    key,
                    Value::Bytes(&claim.fingerprint.digest),
                    Value::Int(i64::from(claim.fingerprint.version)),
                    token,
                    version,
                    Value::Int(claim.lease_micros),
                    Value::Int(claim.ttl_micros),
                ];
                let element = [Value::Int(n as i64), id, scope, key, token];
                (
                    inline(include_str!("sql/insert_row.sql"), &row),
                    inline(include_str!("sql/insert_element.sql"), &element),
                )
            })
            .unzip();
        let statement = spliced(include_str!("sql/insert_batch.sql"))
            .replace("{rows}", &rows.join("    , "))
            .replace("{claims}", &elements.join("\n    UNION ALL "));
        let results = run_request(db, statement).await?;
        let mut replies: Vec<Option<Answer<Self>>> = (0..batch.len()).map(|_| None).collect();
        for row in results.iter().filter_map(|result| match result {
            Either::Right(row) => Some(row),
            Either::Left(_) => None,
        }) {
            let n: i64 = row.try_get("n")?;
            let at = usize::try_from(n)
                .ok()
                .filter(|&at| at < batch.len())
                .ok_or_else(|| {
                    sqlx::Error::Protocol(format!("a row for claim {n} of {}", batch.len()))
                })?;
            replies[at] = Some(inserted(row));
        }
        // A claim without a row: its record was gone by the read.
        Ok(replies
            .into_iter()
            .map(|reply| reply.unwrap_or(Ok(None)))
            .collect())
    }
}

/// What one claim's row says.
fn inserted(row: &sqlx::mysql::MySqlRow) -> Result<Option<Inserted>, StoreError> {
    if row.try_get::<bool, _>("inserted")? {
        return Ok(Some(Inserted::Inserted));
    }
    match record_of(row)? {
        Some(record) => Ok(Some(Inserted::Exists(record, now_of(row)?))),
        None => Ok(None),
    }
}
