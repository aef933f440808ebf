//! The operator tools' statements on SQLite: `inspect` is one read at one instant of the
//! store's clock; `forget`'s `DELETE` is fenced by what that read saw, at the same
//! instant (the tools themselves: `store/sql/operator.rs`).

use sqlx::query::Query;
use sqlx::sqlite::{SqliteArguments, SqliteQueryResult};
use sqlx::{Sqlite, SqlitePool};

use super::SqliteStore;
use super::lease_time::{Now, statement};
use crate::store::sql::operator::{FencedDelete, OperatorStatements};

impl OperatorStatements for SqliteStore {
    type Database = Sqlite;
    type Now = Now;

    fn now(&self) -> Now {
        Now::of(self.clock.as_ref())
    }

    fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn inspect_statement(
        &self,
        scope: &str,
        key: &str,
        now: Now,
    ) -> Query<'static, Sqlite, SqliteArguments> {
        sqlx::query(statement!("sql/inspect.sql"))
            .bind(scope.to_owned())
            .bind(key.to_owned())
            .bind(now.wall)
            .bind(now.boot_id.map(Vec::from))
            .bind(now.boot)
    }

    fn forget_statement(
        &self,
        delete: FencedDelete<'_>,
        now: Now,
    ) -> Query<'static, Sqlite, SqliteArguments> {
        sqlx::query(statement!("sql/forget.sql"))
            .bind(delete.scope.to_owned())
            .bind(delete.key.to_owned())
            .bind(delete.token)
            .bind(delete.state)
            .bind(delete.force)
            .bind(now.wall)
            .bind(now.boot_id.map(Vec::from))
            .bind(now.boot)
    }

    fn deleted(done: &SqliteQueryResult) -> bool {
        done.rows_affected() == 1
    }

    fn forgetting(&self) -> impl Send {
        self.writes.enter()
    }
}
