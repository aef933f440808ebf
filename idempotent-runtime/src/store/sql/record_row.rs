//! A record as the SQL registers' rows carry it (Postgres, MySQL): one decoder of the
//! `{record}` and `{now}` columns their statements select, and the `BIGINT` a version is
//! kept in.

use sqlx::{ColumnIndex, Decode, Row, Type};

use super::decode_completed;
use crate::fingerprint::Fingerprint;
use crate::store::{FencingToken, Record, RecordBody, StoreError, StoreNow};

/// The record a statement's row shows (the `{record}` columns); `None`: none.
pub(crate) fn record_of<R>(row: &R) -> Result<Option<Record>, StoreError>
where
    R: Row,
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i16: Decode<'r, R::Database> + Type<R::Database>,
{
    let Some(state) = row.try_get::<Option<String>, _>("state")? else {
        return Ok(None);
    };
    let digest: Vec<u8> = row.try_get("fingerprint")?;
    let fingerprint = Fingerprint {
        version: row.try_get("fingerprint_version")?,
        digest: digest
            .try_into()
            .map_err(|_| StoreError::Corrupt("a fingerprint digest is not 32 bytes".into()))?,
    };
    let body = match state.as_str() {
        "in_progress" => RecordBody::InProgress {
            lease_expires_at: row.try_get("lease_expires_at_ms")?,
            steps: row
                .try_get::<Option<Vec<u8>>, _>("steps")?
                .map(bytes::Bytes::from)
                .unwrap_or_default(),
        },
        "completed" => RecordBody::Completed(decode_completed(
            row.try_get::<Option<i16>, _>("status")?.map(i64::from),
            row.try_get("headers")?,
            row.try_get("body")?,
        )?),
        other => {
            return Err(StoreError::Corrupt(format!(
                "unknown record state {other:?}"
            )));
        }
    };
    Ok(Some(Record {
        fingerprint,
        token: FencingToken(row.try_get("token")?),
        version: from_column(row.try_get("version")?),
        created_at: row.try_get("created_at_ms")?,
        expires_at: row.try_get("expires_at_ms")?,
        body,
    }))
}

/// The database's clock a statement's row carries (the `{now}` column): one clock for
/// both TTLs and leases.
pub(crate) fn now_of<R>(row: &R) -> Result<StoreNow, StoreError>
where
    R: Row,
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let millis: i64 = row.try_get("now_ms")?;
    Ok(StoreNow {
        wall_millis: millis,
        lease_millis: millis,
    })
}

/// A version as the `BIGINT` column holds it: the same 64 bits.
pub(crate) fn to_column(version: u64) -> i64 {
    i64::from_ne_bytes(version.to_ne_bytes())
}

/// A `BIGINT` column's version.
pub(crate) fn from_column(version: i64) -> u64 {
    u64::from_ne_bytes(version.to_ne_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_keep_their_64_bits_in_the_column() {
        for version in [0, 1, u64::MAX, 1 << 63, (1 << 63) - 1] {
            assert_eq!(from_column(to_column(version)), version);
        }
        assert_eq!(to_column(u64::MAX), -1);
    }
}
