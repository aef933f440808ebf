//! [`CallKey`]: the idempotency key of one logical call, sent on every attempt of it.

use std::fmt;
use std::sync::Arc;

use http::HeaderValue;
use idempotent_policy::MAX_KEY_LEN;

/// The `Idempotency-Key` of one logical call: generated (a UUIDv4) or given by the caller,
/// and sent unchanged, as an RFC 9651 sf-string, on every attempt of that call.
///
/// Give it to a request through the request's extensions (`with_extension` on a
/// `reqwest-middleware` request builder, `Request::extensions_mut` for the tower layer).
/// Inside an `#[idempotent]` handler, derive it from the handler's own key, so a retry of
/// the handler sends the same key downstream:
///
/// ```
/// use idempotent_client::CallKey;
///
/// # let derived = String::from("acct_alice:charge:8e03");
/// // `derived` is `key.derive("charge")` of the handler's `IdempotencyKey`.
/// let key = CallKey::new(derived)?;
/// assert_eq!(key.header_value(), r#""acct_alice:charge:8e03""#);
///
/// let fresh = CallKey::generate();
/// assert_ne!(fresh, CallKey::generate());
/// # Ok::<(), idempotent_client::InvalidKey>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CallKey {
    key: Arc<str>,
    header_value: HeaderValue,
}

/// Why a string cannot be an idempotency key (the server would answer `400`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidKey {
    /// Empty or only spaces.
    #[error("an idempotency key cannot be blank")]
    Blank,
    /// Longer than the servers accept.
    #[error("an idempotency key has at most {max} characters; this one has {len}", max = MAX_KEY_LEN)]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// A character outside printable ASCII (`0x20..=0x7E`).
    #[error("an idempotency key is printable ASCII only")]
    InvalidCharacter,
}

impl CallKey {
    /// A new random key (UUIDv4), for a call that has no natural key of its own.
    pub fn generate() -> Self {
        Self::new(uuid::Uuid::new_v4().to_string()).expect("a UUID is a valid key")
    }

    /// The key `key`, checked against what servers accept: printable ASCII, not blank, at
    /// most 255 characters.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`] naming the rule `key` breaks.
    pub fn new(key: impl Into<String>) -> Result<Self, InvalidKey> {
        let key = key.into();
        if !key.bytes().all(|b| (0x20..=0x7E).contains(&b)) {
            return Err(InvalidKey::InvalidCharacter);
        }
        if key.bytes().all(|b| b == b' ') {
            return Err(InvalidKey::Blank);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(InvalidKey::TooLong { len: key.len() });
        }
        let header_value = HeaderValue::from_str(&idempotent_policy::quote_key(&key))
            .expect("quoted printable ASCII is a valid header value");
        Ok(Self {
            key: key.into(),
            header_value,
        })
    }

    /// The key, unquoted.
    pub fn as_str(&self) -> &str {
        &self.key
    }

    /// The `Idempotency-Key` field value: the key as an sf-string (`"…"`, with `"` and
    /// `\` escaped).
    pub fn header_value(&self) -> HeaderValue {
        self.header_value.clone()
    }
}

impl fmt::Debug for CallKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CallKey").field(&self.key).finish()
    }
}

impl fmt::Display for CallKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked_and_quoted() {
        assert_eq!(
            CallKey::new(r#"a"b\c"#).unwrap().header_value(),
            r#""a\"b\\c""#
        );
        assert_eq!(CallKey::new(""), Err(InvalidKey::Blank));
        assert_eq!(CallKey::new("   "), Err(InvalidKey::Blank));
        assert_eq!(CallKey::new("é"), Err(InvalidKey::InvalidCharacter));
        assert_eq!(CallKey::new("a\tb"), Err(InvalidKey::InvalidCharacter));
        assert!(CallKey::new("k".repeat(MAX_KEY_LEN)).is_ok());
        assert_eq!(
            CallKey::new("k".repeat(MAX_KEY_LEN + 1)),
            Err(InvalidKey::TooLong {
                len: MAX_KEY_LEN + 1
            })
        );
        let generated = CallKey::generate();
        assert_eq!(generated.as_str().len(), 36);
        assert_eq!(
            uuid::Uuid::parse_str(generated.as_str())
                .unwrap()
                .get_version_num(),
            4
        );
    }
}
