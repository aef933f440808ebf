//! What the crates of the project must agree on, defined once for the crates that apply
//! it: the headers never replayed (`idempotent-runtime` strips them before storing a
//! response, `idempotent-macros` refuses them in `exclude_headers`, saying why), the key's
//! header (the runtime parses it, `idempotent-client` sends it and reads the replay
//! marker), and the [`duration`] grammar (the attribute's `ttl = "1h 30m"`, and durations
//! an application reads at run time). Use it through `idempotent-runtime` or
//! `idempotent-client`.
#![no_std]
#![warn(missing_docs)]

extern crate alloc;

pub mod duration;

use alloc::string::String;

/// The request header carrying the key (lower-case).
pub const KEY_HEADER: &str = "idempotency-key";

/// The longest key the server accepts, in characters (after unquoting).
pub const MAX_KEY_LEN: usize = 255;

/// Formats `key` as an RFC 9651 sf-string: wrapped in `"`, with `"` and `\` escaped.
///
/// It does not validate: a key with characters outside printable ASCII gives a value the
/// server refuses.
///
/// ```
/// assert_eq!(idempotent_policy::quote_key(r#"a"b\c"#), r#""a\"b\\c""#);
/// ```
pub fn quote_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 2);
    out.push('"');
    for c in key.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// The header marking a replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// Response headers never stored or replayed, each with the reason: they describe one
/// response or one connection, not the operation.
pub const NEVER_REPLAYED_BECAUSE: [(&str, &str); 12] = [
    ("date", "it describes one response, not the operation"),
    (
        "set-cookie",
        "it is per-request state; replaying it would hand out a stale session",
    ),
    ("content-length", "it is computed for every response"),
    ("connection", "it is a hop-by-hop header"),
    ("keep-alive", "it is a hop-by-hop header"),
    ("proxy-connection", "it is a hop-by-hop header"),
    ("proxy-authenticate", "it is a hop-by-hop header"),
    ("te", "it is a hop-by-hop header"),
    ("trailer", "it is a hop-by-hop header"),
    ("transfer-encoding", "it is computed for every response"),
    ("upgrade", "it is a hop-by-hop header"),
    (REPLAYED_HEADER, "the engine sets it on every replay"),
];

/// The names of [`NEVER_REPLAYED_BECAUSE`] (lower-case), for code that only matches them.
pub const NEVER_REPLAYED: [&str; NEVER_REPLAYED_BECAUSE.len()] = {
    let mut names = [""; NEVER_REPLAYED_BECAUSE.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = NEVER_REPLAYED_BECAUSE[i].0;
        i += 1;
    }
    names
};

/// Why `name` (lower-case) is never replayed, or `None` when it may be.
pub fn never_replayed_because(name: &str) -> Option<&'static str> {
    NEVER_REPLAYED_BECAUSE
        .iter()
        .find(|(never, _)| *never == name)
        .map(|(_, reason)| *reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_lower_case_and_listed_once() {
        for (i, name) in NEVER_REPLAYED.iter().enumerate() {
            assert!(
                name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
                "{name}"
            );
            assert!(!NEVER_REPLAYED[i + 1..].contains(name), "{name} twice");
            assert_eq!(
                never_replayed_because(name),
                Some(NEVER_REPLAYED_BECAUSE[i].1)
            );
        }
        assert_eq!(never_replayed_because("location"), None);
        assert_eq!(never_replayed_because("Date"), None, "names are lower-case");
    }
}
