//! The operator tools' statements on Postgres: `inspect` is one statement at the
//! database's `now()`; `forget`'s `DELETE` is fenced by what that read saw (the tools
//! themselves: `store/sql/operator.rs`).

use sqlx::postgres::{PgArguments, PgQueryResult};
use sqlx::query::Query;
use sqlx::{PgPool, Postgres};

use super::PostgresStore;
use crate::store::sql::operator::{FencedDelete, OperatorStatements};

impl OperatorStatements for PostgresStore {
    type Database = Postgres;
    type Now = ();

    fn now(&self) {}

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn inspect_statement(
        &self,
        scope: &str,
        key: &str,
        (): (),
    ) -> Query<'static, Postgres, PgArguments> {
        sqlx::query(self.sql.inspect.clone())
            .bind(scope.to_owned())
            .bind(key.to_owned())
    }

    fn forget_statement(
        &self,
        delete: FencedDelete<'_>,
        (): (),
    ) -> Query<'static, Postgres, PgArguments> {
        sqlx::query(self.sql.forget.clone())
            .bind(delete.scope.to_owned())
            .bind(delete.key.to_owned())
            .bind(delete.token)
            .bind(delete.state)
            .bind(delete.force)
    }

    fn deleted(done: &PgQueryResult) -> bool {
        done.rows_affected() == 1
    }
}
