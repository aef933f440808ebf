//! The Postgres claim: one statement (`sql/claim.sql`) inserts or takes over, or reads
//! the record that refuses, for a whole batch of claims in one round trip (group commit,
//! `group_commit.rs`).

use sqlx::postgres::types::PgInterval;
use sqlx::postgres::{PgConnection, PgRow};
use sqlx::{Row, SqlStr};

use super::group_commit::{Batch, element_of};
use super::{PostgresStore, interval};
use crate::fingerprint::Fingerprint;
use crate::store::sql::{self, Classified, FoundRow};
use crate::store::{ClaimOutcome, ClaimRequest, StoreError, Takeover, decode_steps};

/// One claim, owned so it can wait for its batch.
pub(super) struct QueuedClaim {
    scope: String,
    key: String,
    fingerprint: Fingerprint,
    token: crate::store::FencingToken,
    ttl: PgInterval,
    lease: PgInterval,
}

impl PostgresStore {
    /// One run of the claim statement (in a batch); `None`: the record changed between
    /// the statement's snapshot and its conflict check (see [`PostgresStore`]), run it
    /// again.
    pub(super) async fn claim_once(
        &self,
        claim: &ClaimRequest<'_>,
    ) -> Result<Option<sql::Answer>, StoreError> {
        self.claims
            .ask(QueuedClaim {
                scope: claim.scope.to_owned(),
                key: claim.key.to_owned(),
                fingerprint: *claim.fingerprint,
                token: claim.token,
                ttl: interval(claim.ttl),
                lease: interval(claim.lease),
            })
            .await
    }
}

impl Batch for QueuedClaim {
    type Reply = Option<sql::Answer>;

    fn record(&self) -> (&str, &str) {
        (&self.scope, &self.key)
    }

    fn after_first(&self, first: &Self, first_reply: &Self::Reply) -> Option<Self::Reply> {
        let same_fingerprint = self.fingerprint == first.fingerprint;
        match first_reply.as_ref()? {
            // The record `first` now holds, as this claim would have found it.
            (ClaimOutcome::Claimed { .. }, _) => {
                let millis = |i: &PgInterval| i.microseconds / 1000;
                let found = FoundRow {
                    state: "in_progress".to_owned(),
                    ttl_ran_out: false,
                    lease_ran_out: false,
                    same_fingerprint,
                    lease_remaining_ms: Some(millis(&first.lease)),
                    ttl_remaining_ms: Some(millis(&first.ttl)),
                    status: None,
                    headers: None,
                    body: None,
                };
                match sql::classify(found).ok()? {
                    Classified::Refused(answer) => Some(Some(answer)),
                    Classified::Claimable(_) => None,
                }
            }
            // The same snapshot and the same fingerprint: the same refusal.
            refused if same_fingerprint => Some(Some(refused.clone())),
            _ => None,
        }
    }

    async fn run<'c>(
        statement: &'c SqlStr,
        db: &'c mut PgConnection,
        batch: &'c [&'c Self],
    ) -> Result<Vec<Result<Self::Reply, StoreError>>, sqlx::Error> {
        let scopes: Vec<&str> = batch.iter().map(|c| c.scope.as_str()).collect();
        let keys: Vec<&str> = batch.iter().map(|c| c.key.as_str()).collect();
        let fingerprints: Vec<&[u8]> = batch.iter().map(|c| &c.fingerprint.digest[..]).collect();
        let versions: Vec<i16> = batch.iter().map(|c| c.fingerprint.version).collect();
        let tokens: Vec<i64> = batch.iter().map(|c| c.token.0).collect();
        let ttls: Vec<PgInterval> = batch.iter().map(|c| c.ttl).collect();
        let leases: Vec<PgInterval> = batch.iter().map(|c| c.lease).collect();
        let rows = sqlx::query(statement.clone())
            .bind(scopes)
            .bind(keys)
            .bind(fingerprints)
            .bind(versions)
            .bind(tokens)
            .bind(ttls)
            .bind(leases)
            .fetch_all(db)
            .await?;
        let mut replies: Vec<Option<Result<Self::Reply, StoreError>>> =
            (0..batch.len()).map(|_| None).collect();
        for row in rows {
            let at = element_of(&row, batch.len())?;
            replies[at] = Some(answer(&row, batch[at].token));
        }
        replies
            .into_iter()
            .map(|reply| reply.ok_or_else(|| sqlx::Error::Protocol("a claim got no row".into())))
            .collect()
    }
}

/// One claim's row: claimed, refused by the record found, or `None` (changed meanwhile).
fn answer(
    row: &PgRow,
    token: crate::store::FencingToken,
) -> Result<Option<sql::Answer>, StoreError> {
    if row.try_get::<bool, _>("claimed")? {
        let takeover: Option<String> = row.try_get("takeover")?;
        // The steps of the row the claim wrote (NULL for a new key or an expired record).
        let steps: Option<Vec<u8>> = row.try_get("steps")?;
        return Ok(Some((
            ClaimOutcome::Claimed {
                token,
                takeover: parse_takeover(takeover.as_deref())?,
                steps: decode_steps(steps.as_deref().unwrap_or_default())?,
            },
            None,
        )));
    }
    // Neither claimed nor found: the conflicting record is not in the snapshot
    // (inserted concurrently).
    if row.try_get::<Option<String>, _>("state")?.is_none() {
        return Ok(None);
    }
    match sql::classify(found_row(row)?)? {
        Classified::Refused(outcome) => Ok(Some(outcome)),
        // Claimable in the snapshot, yet not claimed: it changed meanwhile.
        Classified::Claimable(reason) => {
            tracing::debug!(%reason, "claimable record changed before the takeover");
            Ok(None)
        }
    }
}

fn found_row(row: &PgRow) -> Result<FoundRow, StoreError> {
    let status: Option<i16> = row.try_get("status")?;
    Ok(FoundRow {
        state: row.try_get("state")?,
        ttl_ran_out: row.try_get("ttl_ran_out")?,
        lease_ran_out: row.try_get("lease_ran_out")?,
        same_fingerprint: row.try_get("same_fingerprint")?,
        lease_remaining_ms: row.try_get("lease_remaining_ms")?,
        ttl_remaining_ms: row.try_get("ttl_remaining_ms")?,
        status: status.map(i64::from),
        headers: row.try_get("headers")?,
        body: row.try_get("body")?,
    })
}

/// The reason `sql/claim.sql` reports a claim by (`expired`, `lease_lost`, NULL for a
/// new key) as a [`Takeover`].
fn parse_takeover(name: Option<&str>) -> Result<Option<Takeover>, StoreError> {
    match name {
        None => Ok(None),
        Some("expired") => Ok(Some(Takeover::Expired)),
        Some("lease_lost") => Ok(Some(Takeover::LeaseLost)),
        Some(other) => Err(StoreError::Corrupt(format!(
            "unknown takeover reason {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_takeover_reasons() {
        assert_eq!(parse_takeover(None).unwrap(), None);
        assert_eq!(
            parse_takeover(Some("expired")).unwrap(),
            Some(Takeover::Expired)
        );
        assert_eq!(
            parse_takeover(Some(Takeover::LeaseLost.as_str())).unwrap(),
            Some(Takeover::LeaseLost)
        );
        assert!(parse_takeover(Some("whatever")).is_err());
    }
}
