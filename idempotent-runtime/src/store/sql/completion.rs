//! A completion's parameters: the response as the columns every SQL store writes.

use crate::store::{StoreError, StoredResponse, encode_headers};

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
