//! The operator tools on every SQL dialect, once: `inspect` is the dialect's read of one
//! record into a [`RecordInfo`]; `forget` is that read, which decides, then a fenced
//! `DELETE` that acts only on the record the read saw (run again when it changed in
//! between, like a claim). A dialect gives only its two statements with their
//! parameters bound ([`OperatorStatements`]).

use std::future::Future;

use sqlx::database::HasStatementCache;
use sqlx::query::Query;
use sqlx::{ColumnIndex, Database, Decode, Executor, FromRow, IntoArguments, Pool, Row, Type};

use crate::fingerprint::Fingerprint;
use crate::store::operator::{lease_left_from_millis, system_time_from_micros};
use crate::store::{ForgetOutcome, RecordInfo, RecordState, StoreError, decode_steps};

/// How often `forget` runs again when the record changed between its read and its
/// delete (completed, renewed, taken over meanwhile). One retry almost always suffices.
const FORGET_ATTEMPTS: usize = 8;

/// A dialect's operator statements, and the store's provided operator tools over them.
pub(crate) trait OperatorStatements: Sync {
    /// The dialect.
    type Database: Database + HasStatementCache;

    /// The instant both statements of one forget attempt judge against: the store's
    /// clock where the store keeps time (SQLite), `()` where the database's does.
    type Now: Copy + Send + Sync;

    /// Reads the store's clock, where it has one.
    fn now(&self) -> Self::Now;

    /// The pool both statements run on.
    fn pool(&self) -> &Pool<Self::Database>;

    /// The dialect's `inspect.sql` for (scope, key) at `now`: at most one row, with the
    /// columns of [`InspectRow`].
    fn inspect_statement(
        &self,
        scope: &str,
        key: &str,
        now: Self::Now,
    ) -> Query<'static, Self::Database, <Self::Database as Database>::Arguments>;

    /// The dialect's `forget.sql` for `delete`, judged at `now`.
    fn forget_statement(
        &self,
        delete: FencedDelete<'_>,
        now: Self::Now,
    ) -> Query<'static, Self::Database, <Self::Database as Database>::Arguments>;

    /// Whether `forget.sql` deleted the record.
    fn deleted(done: &<Self::Database as Database>::QueryResult) -> bool;

    /// Held for the whole of one `forget`: SQLite counts it among the store's writes in
    /// flight, which a transactional handler lets go first (`sqlite/writers.rs`).
    fn forgetting(&self) -> impl Send {}

    /// The live record of (scope, key), as an operator sees it.
    async fn inspect_record(&self, scope: &str, key: &str) -> Result<Option<RecordInfo>, StoreError>
    where
        <Self::Database as Database>::Arguments: IntoArguments<Self::Database>,
        for<'c> &'c mut <Self::Database as Database>::Connection:
            Executor<'c, Database = Self::Database>,
        InspectRow: for<'r> FromRow<'r, <Self::Database as Database>::Row>,
    {
        inspected(read_record(self, scope, key, self.now()).await?)
    }

    /// Deletes the record of (scope, key), unless a live lease holds it and not `force`.
    async fn forget_record(
        &self,
        scope: &str,
        key: &str,
        force: bool,
    ) -> Result<ForgetOutcome, StoreError>
    where
        <Self::Database as Database>::Arguments: IntoArguments<Self::Database>,
        for<'c> &'c mut <Self::Database as Database>::Connection:
            Executor<'c, Database = Self::Database>,
        InspectRow: for<'r> FromRow<'r, <Self::Database as Database>::Row>,
    {
        let _forgetting = self.forgetting();
        forget_with_retries(|| forget_once(self, scope, key, force)).await
    }
}

/// What `forget.sql` deletes: the record of (scope, key), only if it is still the one
/// the read saw (`token`, `state`) and, unless `force`, is completed or its lease ran
/// out at the attempt's "now".
#[derive(Debug)]
pub(crate) struct FencedDelete<'a> {
    pub(crate) scope: &'a str,
    pub(crate) key: &'a str,
    pub(crate) token: i64,
    pub(crate) state: String,
    pub(crate) force: bool,
}

/// One `forget` attempt: `None` when the record changed between the read and the delete.
async fn forget_once<S: OperatorStatements + ?Sized>(
    store: &S,
    scope: &str,
    key: &str,
    force: bool,
) -> Result<Option<ForgetOutcome>, StoreError>
where
    <S::Database as Database>::Arguments: IntoArguments<S::Database>,
    for<'c> &'c mut <S::Database as Database>::Connection: Executor<'c, Database = S::Database>,
    InspectRow: for<'r> FromRow<'r, <S::Database as Database>::Row>,
{
    let now = store.now();
    let row = read_record(store, scope, key, now).await?;
    let (token, state, outcome) = match forget_step(row, force)? {
        ForgetStep::Answer(outcome) => return Ok(Some(outcome)),
        ForgetStep::Delete {
            token,
            state,
            outcome,
        } => (token, state, outcome),
    };
    let delete = FencedDelete {
        scope,
        key,
        token,
        state,
        force,
    };
    let done = store
        .forget_statement(delete, now)
        .execute(store.pool())
        .await?;
    Ok(S::deleted(&done).then_some(outcome))
}

/// The row of (scope, key) as `inspect.sql` reads it at `now`, whether live or not.
async fn read_record<S: OperatorStatements + ?Sized>(
    store: &S,
    scope: &str,
    key: &str,
    now: S::Now,
) -> Result<Option<InspectRow>, StoreError>
where
    <S::Database as Database>::Arguments: IntoArguments<S::Database>,
    for<'c> &'c mut <S::Database as Database>::Connection: Executor<'c, Database = S::Database>,
    InspectRow: for<'r> FromRow<'r, <S::Database as Database>::Row>,
{
    let row = store
        .inspect_statement(scope, key, now)
        .fetch_optional(store.pool())
        .await?;
    Ok(row.as_ref().map(InspectRow::from_row).transpose()?)
}

/// A record as a dialect's inspect statement reads it, judged at one "now" of the
/// database's (or the store's) clock.
#[derive(Debug)]
pub(crate) struct InspectRow {
    /// The `state` column: `in_progress` or `completed`.
    pub(crate) state: String,
    /// The claim's fencing token (what forget's delete is fenced by).
    pub(crate) token: i64,
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) fingerprint_version: i64,
    /// Completed only.
    pub(crate) status: Option<i64>,
    /// Microseconds since the Unix epoch.
    pub(crate) created_at_us: i64,
    pub(crate) expires_at_us: i64,
    /// `None` where a dialect clears it on completion.
    pub(crate) lease_expires_at_us: Option<i64>,
    /// Not expired: `expires_at > now`, or in progress with `lease_expires_at > now`.
    pub(crate) live: bool,
    /// `lease_expires_at > now` (in progress only; `None`/`false` otherwise).
    pub(crate) lease_alive: Option<bool>,
    /// `lease_expires_at - now` in milliseconds, rounded up (in progress only).
    pub(crate) lease_left_ms: Option<i64>,
    /// The recorded steps, encoded ([`encode_step`](crate::store::encode_step)); `None`:
    /// none (a completed record's were cleared).
    pub(crate) steps: Option<Vec<u8>>,
}

/// The columns of every dialect's `inspect.sql`, by name.
impl<'r, R: Row> FromRow<'r, R> for InspectRow
where
    &'r str: ColumnIndex<R>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
    bool: Decode<'r, R::Database> + Type<R::Database>,
{
    fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
        Ok(Self {
            state: row.try_get("state")?,
            token: row.try_get("token")?,
            fingerprint: row.try_get("fingerprint")?,
            fingerprint_version: row.try_get("fingerprint_version")?,
            status: row.try_get("status")?,
            created_at_us: row.try_get("created_at_us")?,
            expires_at_us: row.try_get("expires_at_us")?,
            lease_expires_at_us: row.try_get("lease_expires_at_us")?,
            live: row.try_get("live")?,
            lease_alive: row.try_get("lease_alive")?,
            lease_left_ms: row.try_get("lease_left_ms")?,
            steps: row.try_get("steps")?,
        })
    }
}

impl InspectRow {
    fn completed(&self) -> Result<bool, StoreError> {
        match self.state.as_str() {
            "completed" => Ok(true),
            "in_progress" => Ok(false),
            other => Err(StoreError::Corrupt(format!(
                "unknown record state {other:?}"
            ))),
        }
    }

    /// The record as an operator sees it (whether or not it is live).
    pub(crate) fn info(&self) -> Result<RecordInfo, StoreError> {
        let (state, steps) = if self.completed()? {
            let status = self
                .status
                .and_then(|s| u16::try_from(s).ok())
                .ok_or_else(|| {
                    StoreError::Corrupt(format!("completed record with status {:?}", self.status))
                })?;
            (RecordState::Completed { status }, Vec::new())
        } else {
            let lease_expires_at = self
                .lease_expires_at_us
                .ok_or_else(|| StoreError::Corrupt("in progress without a lease".into()))?;
            let state = RecordState::InProgress {
                lease_expires_at: system_time_from_micros(lease_expires_at),
                holder_alive: self.lease_alive.unwrap_or(false),
            };
            (
                state,
                decode_steps(self.steps.as_deref().unwrap_or_default())?,
            )
        };
        let digest = <[u8; 32]>::try_from(self.fingerprint.as_slice())
            .map_err(|_| StoreError::Corrupt("fingerprint is not 32 bytes".into()))?;
        let version = i16::try_from(self.fingerprint_version).map_err(|_| {
            StoreError::Corrupt(format!(
                "fingerprint version {} out of range",
                self.fingerprint_version
            ))
        })?;
        Ok(RecordInfo::new(
            state,
            Fingerprint { version, digest },
            system_time_from_micros(self.created_at_us),
            system_time_from_micros(self.expires_at_us),
        )
        .with_steps(steps))
    }
}

/// `inspect`'s answer from the row its statement read.
fn inspected(row: Option<InspectRow>) -> Result<Option<RecordInfo>, StoreError> {
    match row {
        Some(row) if row.live => row.info().map(Some),
        _ => Ok(None),
    }
}

/// What `forget` does about the record its read found.
#[derive(Debug)]
enum ForgetStep {
    /// Answer without writing: no record, or a live lease and no `force`.
    Answer(ForgetOutcome),
    /// Delete the record the read saw (fenced by its `token` and `state`, and unless
    /// forced by "completed or lease ran out"); if that deletes it, answer `outcome`.
    Delete {
        token: i64,
        state: String,
        outcome: ForgetOutcome,
    },
}

/// The forget rule on the record a read found.
fn forget_step(row: Option<InspectRow>, force: bool) -> Result<ForgetStep, StoreError> {
    let Some(row) = row else {
        return Ok(ForgetStep::Answer(ForgetOutcome::NotFound));
    };
    let outcome = if !row.live {
        // Expired: removed all the same, so the next claim finds nothing at all.
        ForgetOutcome::NotFound
    } else {
        let completed = row.completed()?;
        if !completed && !force && row.lease_alive == Some(true) {
            let left = row.lease_left_ms.unwrap_or(0);
            return Ok(ForgetStep::Answer(ForgetOutcome::Refused {
                lease_left: lease_left_from_millis(left),
            }));
        }
        ForgetOutcome::Forgotten(row.info()?)
    };
    Ok(ForgetStep::Delete {
        token: row.token,
        state: row.state,
        outcome,
    })
}

/// Runs `attempt` until it decides (`Some`), at most [`FORGET_ATTEMPTS`] times.
async fn forget_with_retries<F, Fut>(mut attempt: F) -> Result<ForgetOutcome, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<ForgetOutcome>, StoreError>>,
{
    for n in 1..=FORGET_ATTEMPTS {
        if let Some(outcome) = attempt().await? {
            return Ok(outcome);
        }
        tracing::debug!(
            attempt = n,
            "idempotency record changed during forget; retrying"
        );
    }
    Err(StoreError::backend(
        "the idempotency record kept changing during forget; try again",
    ))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn row(state: &str) -> InspectRow {
        InspectRow {
            state: state.to_owned(),
            token: 7,
            fingerprint: vec![3; 32],
            fingerprint_version: 2,
            status: (state == "completed").then_some(201),
            created_at_us: 1_000_000,
            expires_at_us: 5_000_000,
            lease_expires_at_us: Some(2_000_000),
            live: true,
            lease_alive: Some(state == "in_progress"),
            lease_left_ms: Some(1_500),
            steps: None,
        }
    }

    #[test]
    fn reads_rows_as_record_info() {
        let info = inspected(Some(row("in_progress"))).unwrap().unwrap();
        assert_eq!(
            info.state,
            RecordState::InProgress {
                lease_expires_at: UNIX_EPOCH + Duration::from_secs(2),
                holder_alive: true
            }
        );
        assert_eq!(info.fingerprint.version, 2);
        assert_eq!(info.created_at, UNIX_EPOCH + Duration::from_secs(1));
        assert_eq!(info.expires_at, UNIX_EPOCH + Duration::from_secs(5));
        assert!(info.steps.is_empty());
        let step = crate::store::RecordedStep {
            name: "authorise".to_owned(),
            output: bytes::Bytes::from_static(b"auth_1"),
            recorded_at: UNIX_EPOCH + Duration::from_secs(3),
        };
        let encoded = Some(crate::store::encode_step(&step));
        let with_steps = InspectRow {
            steps: encoded.clone(),
            ..row("in_progress")
        };
        assert_eq!(inspected(Some(with_steps)).unwrap().unwrap().steps, [step]);
        let info = inspected(Some(row("completed"))).unwrap().unwrap();
        assert_eq!(info.state, RecordState::Completed { status: 201 });
        let completed = InspectRow {
            steps: encoded,
            ..row("completed")
        };
        assert!(
            inspected(Some(completed))
                .unwrap()
                .unwrap()
                .steps
                .is_empty()
        );
        let expired = InspectRow {
            live: false,
            ..row("completed")
        };
        assert_eq!(inspected(Some(expired)).unwrap(), None);
        assert_eq!(inspected(None).unwrap(), None);
        for bad in [
            row("gone"),
            InspectRow {
                fingerprint: vec![1; 31],
                ..row("completed")
            },
            InspectRow {
                status: None,
                ..row("completed")
            },
            InspectRow {
                lease_expires_at_us: None,
                ..row("in_progress")
            },
        ] {
            assert!(matches!(inspected(Some(bad)), Err(StoreError::Corrupt(_))));
        }
    }

    #[test]
    fn forget_refuses_only_a_live_lease_unless_forced() {
        assert!(matches!(
            forget_step(None, true).unwrap(),
            ForgetStep::Answer(ForgetOutcome::NotFound)
        ));
        assert!(matches!(
            forget_step(Some(row("in_progress")), false).unwrap(),
            ForgetStep::Answer(ForgetOutcome::Refused { lease_left }) if lease_left == Duration::from_millis(1_500)
        ));
        assert!(matches!(
            forget_step(Some(row("in_progress")), true).unwrap(),
            ForgetStep::Delete {
                token: 7,
                outcome: ForgetOutcome::Forgotten(_),
                ..
            }
        ));
        let lease_ran_out = InspectRow {
            lease_alive: Some(false),
            ..row("in_progress")
        };
        assert!(matches!(
            forget_step(Some(lease_ran_out), false).unwrap(),
            ForgetStep::Delete {
                outcome: ForgetOutcome::Forgotten(_),
                ..
            }
        ));
        assert!(matches!(
            forget_step(Some(row("completed")), false).unwrap(),
            ForgetStep::Delete {
                outcome: ForgetOutcome::Forgotten(_),
                ..
            }
        ));
        let expired = InspectRow {
            live: false,
            ..row("completed")
        };
        assert!(matches!(
            forget_step(Some(expired), false).unwrap(),
            ForgetStep::Delete {
                outcome: ForgetOutcome::NotFound,
                ..
            }
        ));
    }
}
