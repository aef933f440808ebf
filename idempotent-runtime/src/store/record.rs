//! The byte encoding of stored headers, shared by every store, and the compact form in
//! which the engine's replay cache holds a response.
//!
//! Format v1: a `u32` count, then per header a `u32`-length-prefixed name and a
//! `u32`-length-prefixed value, all big-endian. Length prefixes keep it unambiguous for
//! any bytes a header value may hold.

use bytes::Bytes;

use super::{StoreError, StoredResponse};

/// A response held in memory for as long as its record lives: the headers encoded in one
/// allocation (as the SQL stores keep them in a column) and the body shared, instead of a
/// `String` and a `Vec` per header. A record outlives the requests around it, and every
/// allocation it holds is one more chunk that keeps the allocator from merging the
/// requests' freed memory (glibc's malloc then spends far longer on every allocation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CompactResponse {
    /// HTTP status code.
    pub(crate) status: u16,
    headers: Box<[u8]>,
    /// The body, as [`StoredResponse::body`].
    pub(crate) body: Option<Bytes>,
}

impl CompactResponse {
    /// `response` in compact form; its body is shared, not copied.
    pub(crate) fn new(response: &StoredResponse) -> Self {
        Self {
            status: response.status,
            headers: encode_headers(&response.headers).into_boxed_slice(),
            body: response.body.clone(),
        }
    }

    /// The bytes it holds on the heap: the encoded headers and the body's length.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.headers.len() + self.body.as_ref().map_or(0, Bytes::len)
    }

    /// The response again.
    pub(crate) fn to_stored(&self) -> Result<StoredResponse, StoreError> {
        Ok(StoredResponse {
            status: self.status,
            headers: decode_headers(&self.headers)?,
            body: self.body.clone(),
        })
    }
}

/// Encodes headers for a `headers` BLOB column.
pub fn encode_headers(headers: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_headers_len(headers));
    encode_headers_into(&mut out, headers);
    out
}

/// How many bytes [`encode_headers`] writes for `headers`.
pub(crate) fn encoded_headers_len(headers: &[(String, Vec<u8>)]) -> usize {
    4 + headers
        .iter()
        .map(|(n, v)| 8 + n.len() + v.len())
        .sum::<usize>()
}

/// [`encode_headers`], appended to `out`.
pub(crate) fn encode_headers_into(out: &mut Vec<u8>, headers: &[(String, Vec<u8>)]) {
    out.extend_from_slice(&len_u32(headers.len()).to_be_bytes());
    for (name, value) in headers {
        out.extend_from_slice(&len_u32(name.len()).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&len_u32(value.len()).to_be_bytes());
        out.extend_from_slice(value);
    }
}

/// Decodes what [`encode_headers`] wrote.
pub fn decode_headers(mut bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let count = take_u32(&mut bytes)?;
    let mut headers = Vec::new();
    for _ in 0..count {
        let name_len = take_u32(&mut bytes)? as usize;
        let name = take(&mut bytes, name_len)?;
        let name = String::from_utf8(name.to_vec())
            .map_err(|_| StoreError::Corrupt("header name is not UTF-8".into()))?;
        let value_len = take_u32(&mut bytes)? as usize;
        let value = take(&mut bytes, value_len)?.to_vec();
        headers.push((name, value));
    }
    if !bytes.is_empty() {
        return Err(StoreError::Corrupt("trailing bytes after headers".into()));
    }
    Ok(headers)
}

fn len_u32(len: usize) -> u32 {
    // Header blocks are bounded far below 4 GiB by HTTP itself.
    u32::try_from(len).expect("header length fits in u32")
}

fn take_u32(bytes: &mut &[u8]) -> Result<u32, StoreError> {
    let raw = take(bytes, 4)?;
    Ok(u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]))
}

fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8], StoreError> {
    if bytes.len() < n {
        return Err(StoreError::Corrupt("truncated header block".into()));
    }
    let (head, tail) = bytes.split_at(n);
    *bytes = tail;
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_any_bytes() {
        let headers = vec![
            ("content-type".to_owned(), b"application/json".to_vec()),
            ("x-odd".to_owned(), vec![0, 255, b'\n', 4, 0, 0, 0]),
            ("empty".to_owned(), vec![]),
        ];
        assert_eq!(decode_headers(&encode_headers(&headers)).unwrap(), headers);
        assert_eq!(decode_headers(&encode_headers(&[])).unwrap(), vec![]);
    }

    #[test]
    fn a_compact_response_is_the_response() {
        let response = StoredResponse {
            status: 201,
            headers: vec![
                ("content-type".to_owned(), b"application/json".to_vec()),
                ("location".to_owned(), b"/payments/pay_1".to_vec()),
            ],
            body: Some(Bytes::from_static(b"{}")),
        };
        let compact = CompactResponse::new(&response);
        assert_eq!(compact.to_stored().unwrap(), response);
        let no_body = StoredResponse {
            body: None,
            ..response
        };
        assert_eq!(CompactResponse::new(&no_body).to_stored().unwrap(), no_body);
    }

    #[test]
    fn refuses_truncated_or_trailing_input() {
        let encoded = encode_headers(&[("a".to_owned(), b"b".to_vec())]);
        assert!(decode_headers(&encoded[..encoded.len() - 1]).is_err());
        let mut longer = encoded.clone();
        longer.push(0);
        assert!(decode_headers(&longer).is_err());
    }
}
