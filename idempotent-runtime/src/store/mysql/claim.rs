//! The MySQL claim: read the record first (a replay, `409` or `422` is that one
//! non-locking read), then insert a new key or take the record over for the
//! reason the takeover rule gives — each write one atomic statement on the database
//! clock (see the module docs for why not `ON DUPLICATE KEY UPDATE` or `FOR UPDATE`).

use sqlx::Row;
use sqlx::mysql::MySqlDatabaseError;

use super::{MySqlStore, micros, scope_key_sha256};
use crate::store::sql::{self, Classified, FoundRow};
use crate::store::{ClaimOutcome, ClaimRequest, StoreError, Takeover};

const CLAIM_NEW: &str = include_str!("sql/claim_new.sql");
const CLAIM_READ: &str = include_str!("sql/claim_read.sql");
const TAKE_OVER_EXPIRED: &str = include_str!("sql/take_over_expired.sql");
const TAKE_OVER_LEASE_LOST: &str = include_str!("sql/take_over_lease_lost.sql");

/// `ER_LOCK_DEADLOCK`: InnoDB rolled the statement back to break a deadlock.
const LOCK_DEADLOCK: u16 = 1213;
/// `ER_LOCK_WAIT_TIMEOUT`: the statement waited `innodb_lock_wait_timeout` for a row lock.
const LOCK_WAIT_TIMEOUT: u16 = 1205;

/// How a claim statement's error reads for the claim.
enum Failure {
    /// A record of the key exists (the `INSERT` hit the primary key).
    Duplicate,
    /// Another statement on the same row won a lock race: claim again.
    Contention,
    /// Anything else: the store's error.
    Other(StoreError),
}

fn failure(error: sqlx::Error) -> Failure {
    if let sqlx::Error::Database(db) = &error {
        if db.is_unique_violation() {
            return Failure::Duplicate;
        }
        let number = db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number);
        if matches!(number, Some(LOCK_DEADLOCK | LOCK_WAIT_TIMEOUT)) {
            return Failure::Contention;
        }
    }
    Failure::Other(error.into())
}

impl MySqlStore {
    /// One claim attempt; `None`: the record changed under it (or a lock race was lost),
    /// try again.
    pub(super) async fn claim_once(
        &self,
        claim: &ClaimRequest<'_>,
    ) -> Result<Option<sql::Answer>, StoreError> {
        let id = scope_key_sha256(claim.scope, claim.key);
        // Read first: a replay, a `409` or a `422` is answered by this one non-locking
        // read, with no write and no row lock; only a new key or a takeover writes.
        let row = sqlx::query(CLAIM_READ)
            .bind(&claim.fingerprint.digest[..])
            .bind(claim.fingerprint.version)
            .bind(id.as_slice())
            .bind(claim.scope)
            .bind(claim.key)
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else {
            let inserted = sqlx::query(CLAIM_NEW)
                .bind(id.as_slice())
                .bind(claim.scope)
                .bind(claim.key)
                .bind(&claim.fingerprint.digest[..])
                .bind(claim.fingerprint.version)
                .bind(claim.token.0)
                .bind(micros(claim.lease))
                .bind(micros(claim.ttl))
                .execute(&self.pool)
                .await;
            return match inserted.map_err(failure) {
                Ok(_) => Ok(Some((
                    ClaimOutcome::Claimed {
                        token: claim.token,
                        takeover: None,
                    },
                    None,
                ))),
                // Inserted by someone else since the read (or a lock conflict): read again.
                Err(Failure::Duplicate | Failure::Contention) => Ok(None),
                Err(Failure::Other(error)) => Err(error),
            };
        };
        let status: Option<i16> = row.try_get("status")?;
        let found = FoundRow {
            state: row.try_get("state")?,
            ttl_ran_out: row.try_get("ttl_ran_out")?,
            lease_ran_out: row.try_get("lease_ran_out")?,
            same_fingerprint: row.try_get("same_fingerprint")?,
            // The read's clock is its statement's start, which can precede the commit
            // of a claim it sees: never report more than a whole lease.
            lease_remaining_ms: row
                .try_get::<Option<i64>, _>("lease_remaining_ms")?
                .map(|ms| ms.min(i64::try_from(claim.lease.as_millis()).unwrap_or(i64::MAX))),
            ttl_remaining_ms: row.try_get("ttl_remaining_ms")?,
            status: status.map(i64::from),
            headers: row.try_get("headers")?,
            body: row.try_get("body")?,
        };
        let reason = match sql::classify(found)? {
            Classified::Refused(outcome) => return Ok(Some(outcome)),
            Classified::Claimable(reason) => reason,
        };

        let take_over = match reason {
            Takeover::Expired => sqlx::query(TAKE_OVER_EXPIRED)
                .bind(&claim.fingerprint.digest[..])
                .bind(claim.fingerprint.version)
                .bind(claim.token.0)
                .bind(micros(claim.lease))
                .bind(micros(claim.ttl))
                .bind(id.as_slice())
                .bind(claim.scope)
                .bind(claim.key),
            Takeover::LeaseLost => sqlx::query(TAKE_OVER_LEASE_LOST)
                .bind(claim.token.0)
                .bind(micros(claim.lease))
                .bind(micros(claim.ttl))
                .bind(id.as_slice())
                .bind(claim.scope)
                .bind(claim.key)
                .bind(&claim.fingerprint.digest[..])
                .bind(claim.fingerprint.version),
        };
        match take_over.execute(&self.pool).await.map_err(failure) {
            // Rows matched: the reason still held on the newest version of the row.
            Ok(done) => Ok((done.rows_affected() == 1).then_some((
                ClaimOutcome::Claimed {
                    token: claim.token,
                    takeover: Some(reason),
                },
                None,
            ))),
            Err(Failure::Contention | Failure::Duplicate) => Ok(None),
            Err(Failure::Other(error)) => Err(error),
        }
    }
}
