//! The MySQL claim: for a whole batch of claims in one round trip (group commit,
//! `group_commit.rs`), insert the record of every key that has none and read back every
//! claim's record (`sql/claim_batch.sql`): the claims whose record carries their token
//! are claimed; the others are judged by the shared takeover rule — replay, in progress
//! or mismatch from that one read. Only a takeover costs a second request: a fenced
//! `UPDATE`, and for a lost lease the read of the steps it kept by the new token (see the
//! module docs for why not `ON DUPLICATE KEY UPDATE` or `FOR UPDATE`).

use sqlx::mysql::{MySqlConnection, MySqlRow};
use sqlx::{Either, Row};

use super::group_commit::{Answer, Batch, Value, inline, run_request};
use super::lock_conflict;
use super::{MySqlStore, micros, scope_key_sha256};
use crate::fingerprint::Fingerprint;
use crate::store::sql::{self, Classified, FoundRow};
use crate::store::{
    ClaimOutcome, ClaimRequest, FencingToken, RecordedStep, StoreError, Takeover, decode_steps,
};

const CLAIM_BATCH: &str = include_str!("sql/claim_batch.sql");
const CLAIM_BATCH_ROW: &str = include_str!("sql/claim_batch_row.sql");
const CLAIM_BATCH_ELEMENT: &str = include_str!("sql/claim_batch_element.sql");
const TAKE_OVER_EXPIRED: &str = include_str!("sql/take_over_expired.sql");
const TAKE_OVER_LEASE_LOST: &str = include_str!("sql/take_over_lease_lost.sql");

/// The longest `scope` or `key` the schema's `BLOB` columns hold, in bytes. The batch
/// inserts with `INSERT IGNORE`, which would store a longer value cut short (with a
/// warning) instead of failing, so longer ones are refused before they are sent.
const MAX_COLUMN_BYTES: usize = 65_535;

/// One claim, owned so it can wait for its batch.
pub(super) struct QueuedClaim {
    id: Vec<u8>,
    scope: String,
    key: String,
    fingerprint: Fingerprint,
    token: FencingToken,
    lease_micros: i64,
    ttl_micros: i64,
    /// The lease in milliseconds: the most `Retry-After` a record in progress reports.
    lease_millis: i64,
}

/// What the batch found for one claim.
#[derive(Debug, Clone)]
pub(super) enum ClaimStep {
    /// Claimed as a new key, or refused by the record found.
    Decided(sql::Answer),
    /// The record found may be taken over, for this reason: the fenced `UPDATE` decides.
    TakeOver(Takeover),
    /// No record after the insert (released or purged in between), or the batch was
    /// rolled back on a lock conflict: claim again.
    Again,
}

impl MySqlStore {
    /// One claim attempt (in a batch); `None`: the record changed under it (or a lock
    /// race was lost), try again.
    pub(super) async fn claim_once(
        &self,
        claim: &ClaimRequest<'_>,
    ) -> Result<Option<sql::Answer>, StoreError> {
        for (what, value) in [("scope", claim.scope), ("key", claim.key)] {
            if value.len() > MAX_COLUMN_BYTES {
                return Err(StoreError::backend(std::io::Error::other(format!(
                    "a {what} of {} bytes is longer than the MySQL store holds ({MAX_COLUMN_BYTES})",
                    value.len()
                ))));
            }
        }
        let id = scope_key_sha256(claim.scope, claim.key);
        let step = self
            .claims
            .ask(QueuedClaim {
                id: id.clone(),
                scope: claim.scope.to_owned(),
                key: claim.key.to_owned(),
                fingerprint: *claim.fingerprint,
                token: claim.token,
                lease_micros: micros(claim.lease),
                ttl_micros: micros(claim.ttl),
                lease_millis: i64::try_from(claim.lease.as_millis()).unwrap_or(i64::MAX),
            })
            .await?;
        match step {
            ClaimStep::Decided(answer) => Ok(Some(answer)),
            ClaimStep::Again => Ok(None),
            ClaimStep::TakeOver(reason) => self.take_over(claim, &id, reason).await,
        }
    }

    /// The fenced takeover of a record the batch read as claimable for `reason`; `None`
    /// when the reason no longer held on the newest version of the row. A takeover for
    /// a lost lease answers with the record's steps as the takeover left them.
    async fn take_over(
        &self,
        claim: &ClaimRequest<'_>,
        id: &[u8],
        reason: Takeover,
    ) -> Result<Option<sql::Answer>, StoreError> {
        let taken = match reason {
            Takeover::Expired => self.take_over_expired(claim, id).await,
            Takeover::LeaseLost => self.take_over_lease_lost(claim, id).await,
        };
        match taken {
            Ok(steps) => Ok(steps.map(|steps| {
                (
                    ClaimOutcome::Claimed {
                        token: claim.token,
                        takeover: Some(reason),
                        steps,
                    },
                    None,
                )
            })),
            // Another statement on the same row won a lock race: claim again.
            Err(TakeOverError::Sql(error)) if lock_conflict::is_lock_conflict(&error) => Ok(None),
            Err(TakeOverError::Sql(error)) => Err(error.into()),
            Err(TakeOverError::Store(error)) => Err(error),
        }
    }

    /// `sql/take_over_expired.sql`, a prepared statement: a new record lifetime, so no
    /// steps (it clears them). `None`: no row matched.
    async fn take_over_expired(
        &self,
        claim: &ClaimRequest<'_>,
        id: &[u8],
    ) -> Result<Option<Vec<RecordedStep>>, TakeOverError> {
        let done = sqlx::query(TAKE_OVER_EXPIRED)
            .bind(&claim.fingerprint.digest[..])
            .bind(claim.fingerprint.version)
            .bind(claim.token.0)
            .bind(micros(claim.lease))
            .bind(micros(claim.ttl))
            .bind(id)
            .bind(claim.scope)
            .bind(claim.key)
            .execute(&self.pool)
            .await?;
        // Rows matched: the reason still held on the newest version of the row.
        Ok((done.rows_affected() == 1).then(Vec::new))
    }

    /// `sql/take_over_lease_lost.sql`: the fenced `UPDATE` and the read of the steps by
    /// the new token, one request. `None`: the `UPDATE` matched nothing, or the record
    /// was no longer the new token's by the read.
    async fn take_over_lease_lost(
        &self,
        claim: &ClaimRequest<'_>,
        id: &[u8],
    ) -> Result<Option<Vec<RecordedStep>>, TakeOverError> {
        let (scope, key) = (claim.scope.as_bytes(), claim.key.as_bytes());
        let statements = inline(
            TAKE_OVER_LEASE_LOST,
            &[
                Value::Int(claim.token.0),
                Value::Int(micros(claim.lease)),
                Value::Int(micros(claim.ttl)),
                Value::Bytes(id),
                Value::Bytes(scope),
                Value::Bytes(key),
                Value::Bytes(&claim.fingerprint.digest),
                Value::Int(i64::from(claim.fingerprint.version)),
                Value::Bytes(id),
                Value::Bytes(scope),
                Value::Bytes(key),
                Value::Int(claim.token.0),
            ],
        );
        let results = run_request(&self.pool, statements).await?;
        let matched = results.iter().find_map(|result| match result {
            Either::Left(done) => Some(done.rows_affected()),
            Either::Right(_) => None,
        });
        let row = results.iter().find_map(|result| match result {
            Either::Right(row) => Some(row),
            Either::Left(_) => None,
        });
        match (matched, row) {
            (Some(1), Some(row)) => {
                let steps: Option<Vec<u8>> = row.try_get("steps")?;
                Ok(Some(decode_steps(steps.as_deref().unwrap_or_default())?))
            }
            _ => Ok(None),
        }
    }
}

/// A takeover's failure: from the server (a lock conflict means claim again), or the
/// steps it read were unreadable.
#[derive(Debug)]
enum TakeOverError {
    Sql(sqlx::Error),
    Store(StoreError),
}

impl From<sqlx::Error> for TakeOverError {
    fn from(error: sqlx::Error) -> Self {
        Self::Sql(error)
    }
}

impl From<StoreError> for TakeOverError {
    fn from(error: StoreError) -> Self {
        Self::Store(error)
    }
}

impl Batch for QueuedClaim {
    type Reply = ClaimStep;

    fn record_id(&self) -> &[u8] {
        &self.id
    }

    async fn run<'c>(
        db: &'c mut MySqlConnection,
        batch: &'c [&'c Self],
    ) -> Result<Vec<Answer<Self>>, sqlx::Error> {
        // Each claim's record values, in the order both templates take them.
        let (rows, elements): (Vec<String>, Vec<String>) = batch
            .iter()
            .enumerate()
            .map(|(n, claim)| {
                let record = [
                    Value::Bytes(&claim.id),
                    Value::Bytes(claim.scope.as_bytes()),
                    Value::Bytes(claim.key.as_bytes()),
                    Value::Bytes(&claim.fingerprint.digest),
                    Value::Int(i64::from(claim.fingerprint.version)),
                    Value::Int(claim.token.0),
                ];
                let times = [Value::Int(claim.lease_micros), Value::Int(claim.ttl_micros)];
                let position = [Value::Int(n as i64)];
                (
                    inline(CLAIM_BATCH_ROW, &[&record[..], &times].concat()),
                    inline(CLAIM_BATCH_ELEMENT, &[&position[..], &record].concat()),
                )
            })
            .unzip();
        let statement = CLAIM_BATCH
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
            replies[at] = Some(step(row, batch[at]));
        }
        // A claim without a row: its record was gone by the read (released or purged
        // right after the insert found it): claim again.
        Ok(replies
            .into_iter()
            .map(|reply| reply.unwrap_or(Ok(ClaimStep::Again)))
            .collect())
    }

    fn rolled_back() -> Option<ClaimStep> {
        Some(ClaimStep::Again)
    }
}

/// What one claim's row says.
fn step(row: &MySqlRow, claim: &QueuedClaim) -> Result<ClaimStep, StoreError> {
    if row.try_get::<bool, _>("claimed")? {
        return Ok(ClaimStep::Decided((
            ClaimOutcome::Claimed {
                token: claim.token,
                takeover: None,
                steps: Vec::new(),
            },
            None,
        )));
    }
    let status: Option<i16> = row.try_get("status")?;
    let found = FoundRow {
        state: row.try_get("state")?,
        ttl_ran_out: row.try_get("ttl_ran_out")?,
        lease_ran_out: row.try_get("lease_ran_out")?,
        same_fingerprint: row.try_get("same_fingerprint")?,
        // The read's clock is its statement's start, which can precede the commit of a
        // claim it sees: never report more than a whole lease.
        lease_remaining_ms: row
            .try_get::<Option<i64>, _>("lease_remaining_ms")?
            .map(|ms| ms.min(claim.lease_millis)),
        ttl_remaining_ms: row.try_get("ttl_remaining_ms")?,
        status: status.map(i64::from),
        headers: row.try_get("headers")?,
        body: row.try_get("body")?,
    };
    Ok(match sql::classify(found)? {
        Classified::Refused(answer) => ClaimStep::Decided(answer),
        Classified::Claimable(reason) => ClaimStep::TakeOver(reason),
    })
}
