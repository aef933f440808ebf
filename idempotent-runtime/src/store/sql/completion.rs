//! The fenced completion's parameters: the response as columns, and (for the dialects
//! with numbered placeholders) bound the same way for each.

#[cfg(feature = "sqlite")]
use sqlx::query::Query;
#[cfg(feature = "sqlite")]
use sqlx::{Database, Encode, SqlSafeStr, Type};

#[cfg(feature = "sqlite")]
use crate::store::FencingToken;
use crate::store::{StoreError, StoredResponse, encode_headers};

/// `sql` (the dialect's completion statement) with its parameters bound in the order
/// SQLite numbers them (`?N`): scope, key, token,
/// status, headers, body
/// (`NULL`: the body was over the cap). Run it on the pool, or on a transactional
/// handler's connection; one affected row means the token still owned the claim.
#[cfg(feature = "sqlite")]
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
    let columns = CompletionColumns::of(response)?;
    Ok(sqlx::query(sql)
        .bind(scope)
        .bind(key)
        .bind(token.0)
        .bind(columns.status)
        .bind(columns.headers)
        .bind(columns.body))
}

/// A response as the completion writes it: `status`, `headers`, `body` columns. MySQL's
/// placeholders are positional (`?`, in the order they appear), so its statement binds
/// these itself, in its own order.
pub(crate) struct CompletionColumns<'r> {
    /// SMALLINT in every schema; HTTP statuses are three digits.
    pub(crate) status: i16,
    /// [`encode_headers`] of the response's headers.
    pub(crate) headers: Vec<u8>,
    /// `None`: the body was over the cap (`NULL`).
    pub(crate) body: Option<&'r [u8]>,
}

impl<'r> CompletionColumns<'r> {
    /// The columns of `response`; a status that does not fit the schema is refused.
    pub(crate) fn of(response: &'r StoredResponse) -> Result<Self, StoreError> {
        let status = i16::try_from(response.status).map_err(|_| {
            StoreError::Corrupt(format!(
                "status {} does not fit the schema",
                response.status
            ))
        })?;
        Ok(Self {
            status,
            headers: encode_headers(&response.headers),
            body: response.body.as_deref(),
        })
    }
}
