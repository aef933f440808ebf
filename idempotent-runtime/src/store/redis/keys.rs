//! Where a record lives: one Redis key per `(scope, key)`, shaped for Redis Cluster.
//!
//! ```text
//! <prefix>:{<scope length>:<scope>:<key>}
//! e.g. idempotent:{10:acct_alice:8e03978e-40d5-43e8-bc93-6894a57f9324}
//! ```
//!
//! - The braces are a Cluster *hash tag*: the slot is computed from the text between
//!   them, so it covers scope and key and nothing else. Every script touches one record,
//!   hence one key, hence one slot.
//! - The scope's length comes first, so `("a:b", "c")` and `("a", "b:c")` are different
//!   keys (`3:a:b:c` and `1:a:b:c`).
//! - `%`, `{` and `}` inside scope or key are percent-encoded, so a brace in a client's
//!   key can never end the hash tag early (Cluster takes the text up to the *first* `}`)
//!   and the encoding stays one-to-one. The length is that of the encoded scope.
//! - The prefix may not contain braces, so the first `{` in the key is always ours.

use std::borrow::Cow;
use std::fmt::Write as _;

/// The prefix used unless the builder sets another.
pub(super) const DEFAULT_PREFIX: &str = "idempotent";

/// Builds record keys under one prefix.
#[derive(Debug, Clone)]
pub(super) struct KeyLayout {
    prefix: String,
}

impl KeyLayout {
    /// A layout under `prefix`; refuses a prefix a hash tag could not survive.
    pub(super) fn new(prefix: &str) -> Result<Self, String> {
        if prefix.contains(['{', '}']) {
            return Err(format!(
                "invalid key prefix {prefix:?}: it may not contain '{{' or '}}' \
                 (the record's hash tag must be the first braces in its key)"
            ));
        }
        Ok(Self {
            prefix: prefix.to_owned(),
        })
    }

    pub(super) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The key holding the record of `(scope, key)`.
    pub(super) fn record(&self, scope: &str, key: &str) -> String {
        let scope = escape(scope);
        let key = escape(key);
        let mut out = String::with_capacity(self.prefix.len() + scope.len() + key.len() + 16);
        let _ = write!(out, "{}:{{{}:{scope}:{key}}}", self.prefix, scope.len());
        out
    }

    /// The `(scope, key)` whose record lives at `record_key`; `None` for a key this
    /// layout does not make (the sweeper finds records by `SCAN`, which answers keys).
    pub(super) fn parse(&self, record_key: &str) -> Option<(String, String)> {
        let inner = record_key
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(":{")?
            .strip_suffix('}')?;
        let (len, rest) = inner.split_once(':')?;
        let len: usize = len.parse().ok()?;
        let scope = unescape(rest.get(..len)?)?;
        let key = unescape(rest.get(len..)?.strip_prefix(':')?)?;
        // Only the exact spelling `record` gives counts as this layout's.
        (self.record(&scope, &key) == record_key).then_some((scope, key))
    }

    /// A `SCAN … MATCH` pattern for every record key under this prefix (glob characters
    /// in the prefix are escaped).
    pub(super) fn scan_pattern(&self) -> String {
        let mut out = String::with_capacity(self.prefix.len() + 4);
        for c in self.prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                out.push('\\');
            }
            out.push(c);
        }
        out.push_str(":{*");
        out
    }
}

/// Percent-encodes `%`, `{` and `}`; everything else stays as it is.
fn escape(s: &str) -> Cow<'_, str> {
    if !s.contains(['%', '{', '}']) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Undoes [`escape`]; `None` for a `%` that escape does not write.
fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        out.push(match rest.get(at + 1..at + 3)? {
            "25" => '%',
            "7B" => '{',
            "7D" => '}',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text Redis Cluster hashes: between the first `{` and the next `}`.
    fn hash_tag(key: &str) -> &str {
        let open = key.find('{').expect("a hash tag");
        let close = open + 1 + key[open + 1..].find('}').expect("a closed hash tag");
        &key[open + 1..close]
    }

    #[test]
    fn record_keys_carry_prefix_and_a_hash_tag_over_scope_and_key() {
        let layout = KeyLayout::new("payments").unwrap();
        let key = layout.record("acct_alice", "8e03");
        assert_eq!(key, "payments:{10:acct_alice:8e03}");
        assert_eq!(hash_tag(&key), "10:acct_alice:8e03");
    }

    #[test]
    fn scope_and_key_boundaries_are_unambiguous() {
        let layout = KeyLayout::new(DEFAULT_PREFIX).unwrap();
        let keys = [
            layout.record("a:b", "c"),
            layout.record("a", "b:c"),
            layout.record("a:", "bc"),
            layout.record("a", ":bc"),
            layout.record("", "a:bc"),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn braces_in_scope_or_key_never_end_the_hash_tag() {
        let layout = KeyLayout::new("p").unwrap();
        let key = layout.record("t}en{ant", "k}{%7D");
        assert_eq!(key, "p:{12:t%7Den%7Bant:k%7D%7B%257D}");
        assert_eq!(hash_tag(&key), "12:t%7Den%7Bant:k%7D%7B%257D");
        // Escaping is one-to-one: the literal text of an escape is itself escaped.
        assert_ne!(layout.record("s", "}"), layout.record("s", "%7D"));
    }

    #[test]
    fn record_keys_parse_back_to_scope_and_key() {
        let layout = KeyLayout::new("p:q").unwrap();
        for (scope, key) in [
            ("acct_alice", "k1"),
            ("a:b", "c"),
            ("a", "b:c"),
            ("", ""),
            ("t}en{ant", "k}{%7D"),
            ("é", "ü:%"),
        ] {
            let record = layout.record(scope, key);
            assert_eq!(
                layout.parse(&record),
                Some((scope.to_owned(), key.to_owned())),
                "{record}"
            );
        }
        for foreign in [
            "p:q:{1:s:k",
            "p:{1:s:k}",
            "p:q:{2:s:k}",
            "p:q:{+1:s:k}",
            "p:q:{1:s:k%7b}",
            "p:q:{1:s:k%}",
            "p:qx:{1:s:k}",
        ] {
            assert_eq!(layout.parse(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn prefixes_with_braces_are_refused_and_globs_escaped_for_scan() {
        assert!(KeyLayout::new("a{b").is_err());
        assert!(KeyLayout::new("a}b").is_err());
        let layout = KeyLayout::new("app*[1]?\\").unwrap();
        assert_eq!(layout.scan_pattern(), "app\\*\\[1\\]\\?\\\\:{*");
        assert_eq!(KeyLayout::new("").unwrap().record("s", "k"), ":{1:s:k}");
    }
}
