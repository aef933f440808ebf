//! The operator tools on SQLite: `inspect` is one read at one instant of the store's
//! clock; `forget` is that read, then a `DELETE` fenced by what it read (see
//! `store/sql/operator.rs`).

use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::SqliteStore;
use super::lease_time::{Now, statement};
use crate::store::sql::{self, ForgetStep, InspectRow};
use crate::store::{ForgetOutcome, RecordInfo, StoreError};

impl SqliteStore {
    pub(super) async fn inspect_record(
        &self,
        scope: &str,
        key: &str,
    ) -> Result<Option<RecordInfo>, StoreError> {
        sql::inspected(
            self.read_record(scope, key, Now::of(self.clock.as_ref()))
                .await?,
        )
    }

    pub(super) async fn forget_record(
        &self,
        scope: &str,
        key: &str,
        force: bool,
    ) -> Result<ForgetOutcome, StoreError> {
        let _write = self.writes.enter();
        sql::forget_with_retries(|| self.forget_once(scope, key, force)).await
    }

    async fn forget_once(
        &self,
        scope: &str,
        key: &str,
        force: bool,
    ) -> Result<Option<ForgetOutcome>, StoreError> {
        let now = Now::of(self.clock.as_ref());
        let row = self.read_record(scope, key, now).await?;
        let (token, state, outcome) = match sql::forget_step(row, force)? {
            ForgetStep::Answer(outcome) => return Ok(Some(outcome)),
            ForgetStep::Delete {
                token,
                state,
                outcome,
            } => (token, state, outcome),
        };
        let deleted = sqlx::query(statement!("sql/forget.sql"))
            .bind(scope)
            .bind(key)
            .bind(token)
            .bind(state)
            .bind(force)
            .bind(now.wall)
            .bind(now.boot_id.map(Vec::from))
            .bind(now.boot)
            .execute(&self.pool)
            .await?;
        Ok((deleted.rows_affected() == 1).then_some(outcome))
    }

    async fn read_record(
        &self,
        scope: &str,
        key: &str,
        now: Now,
    ) -> Result<Option<InspectRow>, StoreError> {
        let row = sqlx::query(statement!("sql/inspect.sql"))
            .bind(scope)
            .bind(key)
            .bind(now.wall)
            .bind(now.boot_id.map(Vec::from))
            .bind(now.boot)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(inspect_row).transpose()
    }
}

fn inspect_row(row: &SqliteRow) -> Result<InspectRow, StoreError> {
    Ok(InspectRow {
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
    })
}
