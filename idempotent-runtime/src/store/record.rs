//! The byte encoding of stored headers, shared by the SQL stores.
//!
//! Format v1: a `u32` count, then per header a `u32`-length-prefixed name and a
//! `u32`-length-prefixed value, all big-endian. Length prefixes keep it unambiguous for
//! any bytes a header value may hold.

use super::StoreError;

/// Encodes headers for a `headers` BLOB column.
pub fn encode_headers(headers: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        4 + headers
            .iter()
            .map(|(n, v)| 8 + n.len() + v.len())
            .sum::<usize>(),
    );
    out.extend_from_slice(&len_u32(headers.len()).to_be_bytes());
    for (name, value) in headers {
        out.extend_from_slice(&len_u32(name.len()).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&len_u32(value.len()).to_be_bytes());
        out.extend_from_slice(value);
    }
    out
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
    fn refuses_truncated_or_trailing_input() {
        let encoded = encode_headers(&[("a".to_owned(), b"b".to_vec())]);
        assert!(decode_headers(&encoded[..encoded.len() - 1]).is_err());
        let mut longer = encoded.clone();
        longer.push(0);
        assert!(decode_headers(&longer).is_err());
    }
}
