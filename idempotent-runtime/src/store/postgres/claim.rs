//! The Postgres claim: one statement (`sql/claim.sql`) inserts or takes over, or reads
//! the record that refuses, in one round trip.

use sqlx::Row;
use sqlx::postgres::PgRow;

use super::{PostgresStore, interval};
use crate::store::sql::{self, Classified, FoundRow};
use crate::store::{ClaimOutcome, ClaimRequest, StoreError, Takeover};

impl PostgresStore {
    /// One run of the claim statement; `None`: the record changed between the statement's
    /// snapshot and its conflict check (see [`PostgresStore`]), run it again.
    pub(super) async fn claim_once(
        &self,
        claim: &ClaimRequest<'_>,
    ) -> Result<Option<sql::Answer>, StoreError> {
        let row = sqlx::query(self.sql.claim.clone())
            .bind(claim.scope)
            .bind(claim.key)
            .bind(&claim.fingerprint.digest[..])
            .bind(claim.fingerprint.version)
            .bind(claim.token.0)
            .bind(interval(claim.ttl))
            .bind(interval(claim.lease))
            .fetch_optional(&self.pool)
            .await?;
        // No row: the conflicting record is not in the snapshot (inserted concurrently).
        let Some(row) = row else { return Ok(None) };
        if row.try_get::<bool, _>("claimed")? {
            let takeover: Option<String> = row.try_get("takeover")?;
            return Ok(Some((
                ClaimOutcome::Claimed {
                    token: claim.token,
                    takeover: parse_takeover(takeover.as_deref())?,
                },
                None,
            )));
        }
        match sql::classify(found_row(&row)?)? {
            Classified::Refused(outcome) => Ok(Some(outcome)),
            // Claimable in the snapshot, yet not claimed: it changed meanwhile.
            Classified::Claimable(reason) => {
                tracing::debug!(%reason, "claimable record changed before the takeover");
                Ok(None)
            }
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
