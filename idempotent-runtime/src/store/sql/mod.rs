//! What every SQL store shares, whatever its dialect: the claim of the stores that
//! still decide in their own statements (`claim.rs`: a found record classified by the
//! takeover rule, the retry loop), completed-row decoding, the registers' record rows
//! (`record_row.rs`: Postgres and MySQL), the fenced completion's
//! parameters, migrator construction and the check that the embedded migrations are the
//! files in `migrations/<dialect>/`, URL redaction for messages, the operator tools over
//! a dialect's two statements (`operator.rs`), and the skeleton of the stores' batching
//! tasks (`batcher.rs`).

use bytes::Bytes;

use super::{StoreError, StoredResponse, decode_headers};

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod batcher;
#[cfg(feature = "sqlite")]
mod claim;
mod completion;
mod migrations;
#[cfg(feature = "sqlite")]
pub(crate) mod operator;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod record_row;

#[cfg(feature = "sqlite")]
pub(crate) use claim::{Answer, Classified, FoundRow, claim_with_retries, classify};

pub(crate) use super::redact::redact_url;
#[cfg(any(feature = "mysql", feature = "sqlite", feature = "postgres"))]
pub(crate) use completion::CompletionColumns;
#[cfg(feature = "sqlite")]
pub(crate) use completion::bind_completion;
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
