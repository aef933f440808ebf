//! What every SQL store shares, whatever its dialect: completed-row decoding, the
//! registers' record rows through sqlx's named columns (`record_row.rs`: Postgres and
//! MySQL), a completion's parameters, migrator construction and the check that the
//! embedded migrations are the files in `migrations/<dialect>/`, URL redaction for
//! messages, and the skeleton of the stores' batching tasks (`batcher.rs`).

use bytes::Bytes;

use super::{StoreError, StoredResponse, decode_headers};

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod batcher;
mod completion;
mod migrations;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod record_row;

pub(crate) use super::redact::redact_url;
#[cfg(any(feature = "mysql", feature = "sqlite", feature = "postgres"))]
pub(crate) use completion::CompletionColumns;
#[cfg(test)]
pub(crate) use migrations::assert_embedded_migrations_match;
pub(crate) use migrations::{EmbeddedMigration, migrator};
#[cfg(feature = "postgres")]
pub(crate) use record_row::from_column;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use record_row::{now_of, record_of, to_column};

/// A completed record's columns as the response to replay.
pub(crate) fn decode_completed(
    status: Option<i64>,
    headers: Option<Vec<u8>>,
    body: Option<Vec<u8>>,
) -> Result<StoredResponse, StoreError> {
    let status = status
        .and_then(|s| u16::try_from(s).ok())
        .ok_or_else(|| StoreError::Corrupt(format!("completed record with status {status:?}")))?;
    let headers =
        headers.ok_or_else(|| StoreError::Corrupt("completed record without headers".into()))?;
    Ok(StoredResponse {
        status,
        headers: decode_headers(&headers)?,
        body: body.map(Bytes::from),
    })
}
