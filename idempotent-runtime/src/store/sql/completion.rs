//! The fenced completion's parameters, bound the same way for every dialect.

use sqlx::query::Query;
use sqlx::{Database, Encode, SqlSafeStr, Type};

use crate::store::{FencingToken, StoreError, StoredResponse, encode_headers};

/// `sql` (the dialect's completion statement) with its parameters bound in the order
/// every dialect's statement numbers them: scope, key, token, status, headers, body
/// (`NULL`: the body was over the cap). Run it on the pool, or on a transactional
/// handler's connection; one affected row means the token still owned the claim.
pub(crate) fn bind_completion<'q, DB>(
    sql: impl SqlSafeStr,
    scope: &str,
    key: &str,
    token: FencingToken,
    response: &StoredResponse,
) -> Result<Query<'q, DB, DB::Arguments>, StoreError>
where
    DB: Database,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    for<'a> i64: Encode<'a, DB> + Type<DB>,
    for<'a> i16: Encode<'a, DB> + Type<DB>,
    for<'a> Vec<u8>: Encode<'a, DB> + Type<DB>,
    for<'a> Option<&'a [u8]>: Encode<'a, DB> + Type<DB>,
{
    // SMALLINT in every schema; HTTP statuses are three digits.
    let status = i16::try_from(response.status).map_err(|_| {
        StoreError::Corrupt(format!(
            "status {} does not fit the schema",
            response.status
        ))
    })?;
    Ok(sqlx::query(sql)
        .bind(scope)
        .bind(key)
        .bind(token.0)
        .bind(status)
        .bind(encode_headers(&response.headers))
        .bind(response.body.as_deref()))
}
