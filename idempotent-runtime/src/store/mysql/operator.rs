//! The operator tools' statements on MySQL: `inspect` is one consistent read at the
//! database's `UTC_TIMESTAMP(6)`; `forget`'s `DELETE`, by `scope_key_sha256`, is fenced
//! by what that read saw (the tools themselves: `store/sql/operator.rs`).

use sqlx::mysql::{MySqlArguments, MySqlQueryResult};
use sqlx::query::Query;
use sqlx::{MySql, MySqlPool};

use super::{MySqlStore, scope_key_sha256};
use crate::store::sql::operator::{FencedDelete, OperatorStatements};

const INSPECT: &str = include_str!("sql/inspect.sql");
const FORGET: &str = include_str!("sql/forget.sql");

impl OperatorStatements for MySqlStore {
    type Database = MySql;
    type Now = ();

    fn now(&self) {}

    fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    fn inspect_statement(
        &self,
        scope: &str,
        key: &str,
        (): (),
    ) -> Query<'static, MySql, MySqlArguments> {
        sqlx::query(INSPECT)
            .bind(scope_key_sha256(scope, key))
            .bind(scope.to_owned())
            .bind(key.to_owned())
    }

    fn forget_statement(
        &self,
        delete: FencedDelete<'_>,
        (): (),
    ) -> Query<'static, MySql, MySqlArguments> {
        sqlx::query(FORGET)
            .bind(scope_key_sha256(delete.scope, delete.key))
            .bind(delete.scope.to_owned())
            .bind(delete.key.to_owned())
            .bind(delete.token)
            .bind(delete.state)
            .bind(delete.force)
    }

    fn deleted(done: &MySqlQueryResult) -> bool {
        done.rows_affected() == 1
    }
}
