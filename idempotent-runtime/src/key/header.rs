//! Parsing the `Idempotency-Key` request header; the rules are in the [`key`](crate::key)
//! module docs.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName};

/// The longest key accepted, in characters.
pub const MAX_KEY_LEN: usize = idempotent_policy::MAX_KEY_LEN;

/// Why a request's idempotency key was refused (`400` problem+json).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// No `Idempotency-Key` field.
    #[error("the request has no Idempotency-Key header")]
    Missing,
    /// An empty or whitespace-only key (after unquoting: `""` and `"   "` are blank).
    #[error("the Idempotency-Key header is blank")]
    Blank,
    /// More than [`MAX_KEY_LEN`] characters after unquoting.
    #[error("the Idempotency-Key is {len} characters long; at most {max} are allowed", max = MAX_KEY_LEN)]
    TooLong {
        /// The key's length, in characters, after unquoting.
        len: usize,
    },
    /// A byte outside printable ASCII (`0x20..=0x7E`) anywhere in the field value, other
    /// than the surrounding whitespace: control characters, inner tabs, obs-text/UTF-8.
    #[error("the Idempotency-Key contains a character outside printable ASCII")]
    InvalidCharacter,
    /// A value that is neither one RFC 9651 sf-string nor a bare key: a backslash escape
    /// other than `\"` or `\\`, an unterminated quote, characters after the closing quote,
    /// or a bare key containing whitespace, `,`, `;` or `"`. The payload is a short
    /// reason.
    #[error("the Idempotency-Key is not a valid structured-field string: {0}")]
    MalformedQuoting(&'static str),
    /// More than one `Idempotency-Key` field.
    #[error("the request has more than one Idempotency-Key header")]
    Multiple,
}

/// Reads and validates the key from the field `name` of `headers` (normally
/// `Idempotency-Key`), returning the unquoted key. See the [module docs](crate::key) for the
/// rules.
///
/// # Errors
///
/// A [`KeyError`] naming the first rule the field breaks.
///
/// # Example
///
/// ```
/// use http::{HeaderMap, HeaderName, HeaderValue};
/// use idempotent_runtime::key::{parse_header, KeyError};
///
/// let name = HeaderName::from_static("idempotency-key");
/// let mut headers = HeaderMap::new();
/// headers.insert(&name, HeaderValue::from_static(r#""8e03-\"x\"""#));
/// assert_eq!(parse_header(&headers, &name).unwrap(), r#"8e03-"x""#);
///
/// headers.insert(&name, HeaderValue::from_static("8e03"));
/// assert_eq!(parse_header(&headers, &name).unwrap(), "8e03");
///
/// headers.append(&name, HeaderValue::from_static("other"));
/// assert_eq!(parse_header(&headers, &name), Err(KeyError::Multiple));
/// ```
pub fn parse_header(headers: &HeaderMap, name: &HeaderName) -> Result<String, KeyError> {
    let mut fields = headers.get_all(name).iter();
    let value = fields.next().ok_or(KeyError::Missing)?;
    if fields.next().is_some() {
        return Err(KeyError::Multiple);
    }
    parse_value(value.as_bytes())
}

/// Formats `key` as an RFC 9651 sf-string: wrapped in `"`, with `"` and `\` escaped.
///
/// For any key [`parse_header`] accepts, parsing the result gives the key back. `quote`
/// does not validate: a key with characters outside printable ASCII gives a value that
/// [`parse_header`] refuses.
///
/// ```
/// assert_eq!(idempotent_runtime::key::quote(r#"a"b\c"#), r#""a\"b\\c""#);
/// ```
pub fn quote(key: &str) -> String {
    idempotent_policy::quote_key(key)
}

/// Parses one field value (raw bytes, any content) into the unquoted key.
fn parse_value(raw: &[u8]) -> Result<String, KeyError> {
    let value = trim_ows(raw);
    if !value.iter().all(|b| (0x20..=0x7E).contains(b)) {
        return Err(KeyError::InvalidCharacter);
    }
    let key = match value.split_first() {
        Some((b'"', rest)) => Cow::Owned(unquote(rest)?),
        _ => Cow::Borrowed(bare(value)?),
    };
    if key.iter().all(|&b| b == b' ') {
        return Err(KeyError::Blank);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong { len: key.len() });
    }
    // Every byte is printable ASCII, checked above: the key is UTF-8, and an owned one
    // becomes the `String` without a copy.
    String::from_utf8(key.into_owned()).map_err(|_| KeyError::InvalidCharacter)
}

/// Strips leading and trailing SP/HTAB (HTTP's OWS).
fn trim_ows(mut value: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    value
}

/// The body of an sf-string after its opening quote, which must end with the closing
/// quote. Input is printable ASCII.
fn unquote(rest: &[u8]) -> Result<Vec<u8>, KeyError> {
    let mut key = Vec::with_capacity(rest.len());
    let mut bytes = rest.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&escaped @ (b'"' | b'\\')) => key.push(escaped),
                Some(_) => {
                    return Err(KeyError::MalformedQuoting(
                        "a backslash may only escape '\"' or '\\'",
                    ));
                }
                None => return Err(KeyError::MalformedQuoting("unterminated quoted string")),
            },
            b'"' => {
                return if bytes.as_slice().is_empty() {
                    Ok(key)
                } else {
                    Err(KeyError::MalformedQuoting(
                        "characters after the closing quote",
                    ))
                };
            }
            _ => key.push(b),
        }
    }
    Err(KeyError::MalformedQuoting("unterminated quoted string"))
}

/// A bare (unquoted) key. Input is trimmed printable ASCII.
fn bare(value: &[u8]) -> Result<&[u8], KeyError> {
    for &b in value {
        let reason = match b {
            b' ' => "an unquoted key cannot contain spaces; quote it",
            b',' => "an unquoted key cannot contain ','; was it a list of keys?",
            b';' => "an unquoted key cannot contain ';' (parameters are not supported)",
            b'"' => "a quote inside an unquoted key",
            _ => continue,
        };
        return Err(KeyError::MalformedQuoting(reason));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn name() -> HeaderName {
        HeaderName::from_static("idempotency-key")
    }

    fn one(value: &[u8]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            name(),
            HeaderValue::from_bytes(value).expect("valid header value"),
        );
        headers
    }

    fn parse(value: &str) -> Result<String, KeyError> {
        parse_header(&one(value.as_bytes()), &name())
    }

    fn malformed(result: Result<String, KeyError>) -> bool {
        matches!(result, Err(KeyError::MalformedQuoting(_)))
    }

    #[test]
    fn quoted_and_bare_are_one_key() {
        assert_eq!(parse(r#""abc""#).unwrap(), "abc");
        assert_eq!(parse("abc").unwrap(), "abc");
        let uuid = "8e03978e-40d5-43e8-bc93-6894a57f9324";
        assert_eq!(parse(uuid).unwrap(), uuid);
        assert_eq!(parse(&quote(uuid)).unwrap(), uuid);
    }

    #[test]
    fn escapes_are_unquoted() {
        assert_eq!(parse(r#""a\"b""#).unwrap(), r#"a"b"#);
        assert_eq!(parse(r#""a\\b""#).unwrap(), r"a\b");
        assert_eq!(parse(r#""\\\"""#).unwrap(), r#"\""#);
    }

    #[test]
    fn outer_whitespace_is_ignored_inner_is_kept() {
        assert_eq!(parse("  abc\t ").unwrap(), "abc");
        assert_eq!(parse("\t\"abc\" ").unwrap(), "abc");
        assert_eq!(parse(r#"" a b ""#).unwrap(), " a b ");
    }

    #[test]
    fn missing_field() {
        assert_eq!(
            parse_header(&HeaderMap::new(), &name()),
            Err(KeyError::Missing)
        );
        // Another header does not count.
        let mut headers = HeaderMap::new();
        headers.insert("idempotency", HeaderValue::from_static("abc"));
        assert_eq!(parse_header(&headers, &name()), Err(KeyError::Missing));
    }

    #[test]
    fn multiple_fields() {
        let mut headers = one(b"abc");
        headers.append(name(), HeaderValue::from_static("abc"));
        assert_eq!(parse_header(&headers, &name()), Err(KeyError::Multiple));
        // Even when one of them is invalid: the count is checked first.
        let mut headers = one(b"");
        headers.append(name(), HeaderValue::from_static("\"x"));
        assert_eq!(parse_header(&headers, &name()), Err(KeyError::Multiple));
    }

    #[test]
    fn configured_header_name() {
        let custom = HeaderName::from_static("x-request-key");
        let mut headers = one(b"abc");
        headers.insert(&custom, HeaderValue::from_static("\"xyz\""));
        assert_eq!(parse_header(&headers, &custom).unwrap(), "xyz");
    }

    #[test]
    fn blank() {
        for value in ["", "   ", "\t", r#""""#, r#""   ""#, " \"\" "] {
            assert_eq!(parse(value), Err(KeyError::Blank), "{value:?}");
        }
    }

    #[test]
    fn length_limit_counts_unquoted_characters() {
        let max = "k".repeat(MAX_KEY_LEN);
        assert_eq!(parse(&max).unwrap(), max);
        assert_eq!(parse(&quote(&max)).unwrap(), max);
        let too_long = "k".repeat(MAX_KEY_LEN + 1);
        assert_eq!(parse(&too_long), Err(KeyError::TooLong { len: 256 }));
        assert_eq!(
            parse(&quote(&too_long)),
            Err(KeyError::TooLong { len: 256 })
        );
        // 255 escaped quotes: 512 bytes on the wire, 255 characters of key.
        let quotes = "\"".repeat(MAX_KEY_LEN);
        assert_eq!(parse(&quote(&quotes)).unwrap(), quotes);
        assert_eq!(
            parse(&quote(&format!("{quotes}\""))),
            Err(KeyError::TooLong { len: 256 })
        );
    }

    #[test]
    fn invalid_characters() {
        for value in [
            &b"ab\xc3\xa9"[..],     // UTF-8
            b"\"ab\xff\"",          // obs-text inside quotes
            b"\x80",                // lone obs-text
            b"a\tb",                // inner tab, bare
            b"\"a\tb\"",            // inner tab, quoted
            b"\xe2\x80\x8b\"abc\"", // zero-width space before the quote
        ] {
            let headers = HeaderMap::from_iter([(
                name(),
                HeaderValue::from_bytes(value).expect("valid header value"),
            )]);
            assert_eq!(
                parse_header(&headers, &name()),
                Err(KeyError::InvalidCharacter),
                "{value:?}"
            );
        }
        // Bytes a HeaderValue cannot hold, through the byte-level parser.
        for value in [&b"a\0b"[..], b"a\x01b", b"a\r\nb", b"\x7f", b"\"\x1b\""] {
            assert_eq!(parse_value(value), Err(KeyError::InvalidCharacter));
        }
    }

    #[test]
    fn malformed_quoting() {
        for value in [
            r#""abc"#,        // unterminated
            r#"""#,           // lone quote
            r#""abc\"#,       // escape at the end
            r#""a\nb""#,      // unknown escape
            r#""a\'b""#,      // unknown escape
            r#""abc"def"#,    // trailing characters
            r#""abc" "def""#, // two strings
            r#""abc", "d""#,  // a list
            r#""abc";p=1"#,   // parameters
        ] {
            assert!(malformed(parse(value)), "{value:?} gave {:?}", parse(value));
        }
    }

    #[test]
    fn bare_key_rules() {
        // Lenient: any visible ASCII but the delimiters, any first character.
        for key in [
            "8e03",
            "a:b/c",
            "base64+/==",
            "a(b)<c>@[d]{e}?=",
            r"a\b",
            "*tok",
            "'`|~",
        ] {
            assert_eq!(parse(key).unwrap(), key);
        }
        // Strict where the delimiter has meaning.
        for value in ["abc def", "a, b", "a,b", "abc;p=1", "ab\"c\"", "abc\""] {
            assert!(malformed(parse(value)), "{value:?} gave {:?}", parse(value));
        }
    }

    #[test]
    fn quote_escapes_only_quote_and_backslash() {
        assert_eq!(quote("abc"), r#""abc""#);
        assert_eq!(quote(""), r#""""#);
        assert_eq!(quote(r#"a"b\c'd"#), r#""a\"b\\c'd""#);
    }

    /// RFC 9110 `tchar`, one to 255 of them.
    const TCHAR_TOKEN: &str = "[!#$%&'*+.^_`|~0-9A-Za-z-]{1,255}";

    proptest! {
        #[test]
        fn arbitrary_header_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = parse_value(&bytes);
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                let headers = HeaderMap::from_iter([(name(), value)]);
                let _ = parse_header(&headers, &name());
            }
        }

        #[test]
        fn accepted_keys_are_printable_bounded_and_not_blank(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            if let Ok(key) = parse_value(&bytes) {
                prop_assert!(!key.is_empty() && key.len() <= MAX_KEY_LEN);
                prop_assert!(key.bytes().all(|b| (0x20..=0x7E).contains(&b)));
                prop_assert!(!key.bytes().all(|b| b == b' '));
            }
        }

        #[test]
        fn quote_round_trips(key in "[ -~]{1,255}") {
            prop_assume!(!key.bytes().all(|b| b == b' '));
            prop_assert_eq!(parse(&quote(&key)), Ok(key));
        }

        #[test]
        fn quote_round_trips_with_many_escapes(key in r#"[\\" a]{1,255}"#) {
            prop_assume!(!key.bytes().all(|b| b == b' '));
            prop_assert_eq!(parse(&quote(&key)), Ok(key));
        }

        #[test]
        fn bare_tchar_tokens_are_unchanged(key in TCHAR_TOKEN) {
            prop_assert_eq!(parse(&key), Ok(key.clone()));
            prop_assert_eq!(parse(&format!(" {key}\t")), Ok(key));
        }

        #[test]
        fn quoted_and_bare_agree(key in "[!#$%&'*+.^_`|~0-9A-Za-z-]{1,300}") {
            prop_assert_eq!(parse(&key), parse(&quote(&key)));
        }
    }
}
