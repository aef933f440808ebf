//! The SQLite claim: read the record first, and only when there is none (or the takeover
//! rule lets the claim replace it) write — each write one atomic statement.
//!
//! A replay, `409` or `422` is one plain read: no write transaction, so it never queues
//! behind SQLite's one writer (in WAL mode a reader sees the last committed state and
//! waits for nobody). A fresh key costs the read that finds nothing plus the insert; a
//! takeover the read plus the fenced `UPDATE`. The read only *decides whether to write*:
//! the insert is `ON CONFLICT DO NOTHING` and a takeover's `WHERE` is its reason's
//! condition, both checked by the writer on the record as it is at that moment. A record
//! that appeared or changed since the read (claimed by a racing request, released,
//! purged, completed, taken over) makes that write affect no row, and the claim runs
//! again from the start — so exactly one of any number of racing claims wins.
//!
//! A takeover of a lost lease resumes the earlier execution: its `UPDATE` keeps the
//! record's steps and returns them (`RETURNING steps`), as the writer left the row — every
//! step committed before it, none after, since the old owner's `record_step.sql` is
//! fenced by the token the takeover replaced. The read's snapshot is never where they come
//! from: a step may commit between the read and the write.
//!
//! The read goes through the store's reader (`group_read.rs`), batched with other
//! claims' reads. The write goes through the store's writer (`group_commit.rs`), which
//! may run it in one transaction with other requests' writes; it is answered only once
//! that transaction committed, so the claim is durable before its handler runs, and a
//! claim that runs again reads the committed record that beat it.

use super::SqliteStore;
use super::group_commit::{Write, WriteKind};
use super::group_read::ClaimRead;
use super::lease_time::{Now, statement};
use crate::clock::millis;
use crate::store::sql::{self, Classified};
use crate::store::{ClaimOutcome, ClaimRequest, StoreError, Takeover, decode_steps, steps_survive};

const CLAIM_NEW: &str = include_str!("sql/claim_new.sql");

impl SqliteStore {
    /// One claim attempt at one instant of the store's clock; `None`: the record changed
    /// under it, try again.
    pub(super) async fn claim_once(
        &self,
        claim: &ClaimRequest<'_>,
    ) -> Result<Option<sql::Answer>, StoreError> {
        let now = Now::of(self.clock.as_ref());
        let read = ClaimRead {
            scope: claim.scope.to_owned(),
            key: claim.key.to_owned(),
            now,
            fingerprint: claim.fingerprint.digest,
            fingerprint_version: i64::from(claim.fingerprint.version),
        };
        let Some(found) = self.reader.read(read).await? else {
            let inserted = self
                .writer
                .write(claim_write(CLAIM_NEW, WriteKind::Claim, claim, now))
                .await?;
            // No row inserted: a racing claim created the record since the read.
            return Ok((inserted == 1).then_some((
                ClaimOutcome::Claimed {
                    token: claim.token,
                    takeover: None,
                    steps: Vec::new(),
                },
                None,
            )));
        };
        let reason = match sql::classify(found)? {
            Classified::Refused(outcome) => return Ok(Some(outcome)),
            Classified::Claimable(reason) => reason,
        };
        let statement = match reason {
            Takeover::Expired => statement!("sql/take_over_expired.sql"),
            Takeover::LeaseLost => statement!("sql/take_over_lease_lost.sql"),
        };
        let taken = self
            .writer
            .write_returning(claim_write(statement, WriteKind::TakeOver, claim, now))
            .await?;
        if taken.rows != 1 {
            return Ok(None);
        }
        // The steps as the takeover's own statement left them (its `RETURNING`), never
        // as the read saw them: the old owner may have recorded one in between.
        let steps = match taken.steps {
            Some(steps) if steps_survive(reason) => decode_steps(&steps)?,
            _ => Vec::new(),
        };
        Ok(Some((
            ClaimOutcome::Claimed {
                token: claim.token,
                takeover: Some(reason),
                steps,
            },
            None,
        )))
    }
}

/// The write of a claim statement (see `sql/claim_new.sql` for the parameters they
/// share), for the store's writer.
fn claim_write(
    statement: &'static str,
    kind: WriteKind,
    claim: &ClaimRequest<'_>,
    now: Now,
) -> Write {
    Write::Claim {
        statement,
        kind,
        scope: claim.scope.to_owned(),
        key: claim.key.to_owned(),
        fingerprint: claim.fingerprint.digest,
        fingerprint_version: i64::from(claim.fingerprint.version),
        token: claim.token,
        lease_expires_at: now.lease_expires_at(claim.lease),
        now,
        expires_at: now.wall.saturating_add(millis(claim.ttl)),
        lease_ends_boot: now.lease_ends_boot(claim.lease),
    }
}
