//! Target `json`: JSON-mode fingerprints of generated documents (escapes, surrogate
//! pairs and lone surrogates, keys that decode alike, duplicates, numbers as written,
//! deep nesting) against two oracles:
//!
//! - the canonical form the `fingerprint` module docs specify, built here from the
//!   generated tree (members stably sorted by decoded key, everything else as written)
//!   and framed as documented: every rendering of the tree, in any whitespace and any
//!   member order that keeps same-key members in order, must have exactly that digest;
//! - serde_json: documents that parse to different `serde_json::Value`s must not share a
//!   fingerprint, and byte-mutated documents are JSON for the fingerprint exactly when
//!   serde_json says so (where serde_json decides: it refuses numbers beyond f64, lone
//!   surrogates and more than 128 levels, all valid JSON).

use http::Method;
use idempotent_runtime::{Fingerprint, FingerprintMode};

use super::Verdict;
use super::framing::{JSON_TAG, frame};
use super::rng::Rng;

/// A generated JSON value; every scalar and key keeps its spelling.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Json {
    /// `null`, `true`, `false` or a number, as written.
    Token(String),
    Str(JsonString),
    Array(Vec<Json>),
    Object(Vec<(JsonString, Json)>),
}

/// A string's text between the quotes, and what it decodes to (code points; a lone
/// surrogate stays a code point of its own).
#[derive(Debug, Clone, PartialEq, Eq)]
struct JsonString {
    raw: String,
    decoded: Vec<u32>,
}

impl JsonString {
    fn new(raw: String) -> Self {
        let decoded = decode(&raw);
        Self { raw, decoded }
    }
}

/// Whether serde_json refused a text for a reason that does not make it invalid JSON.
pub(crate) fn serde_refuses_valid_json(err: &serde_json::Error) -> bool {
    let message = err.to_string();
    [
        "number out of range",
        "lone leading surrogate",
        "unexpected end of hex escape",
        "recursion limit exceeded",
    ]
    .iter()
    .any(|reason| message.starts_with(reason))
}

/// A generated document in random whitespace (for the other targets).
pub(crate) fn document(rng: &mut Rng) -> String {
    let depth = rng.below(4);
    let tree = value(rng, depth);
    render(&tree, rng, false)
}

pub(crate) fn run(rng: &mut Rng) -> Verdict {
    let depth = rng.below(5);
    let tree = if rng.one_in(400) {
        deep(rng)
    } else {
        value(rng, depth)
    };
    let expected = canonical_digest(&tree);
    let a = render(&tree, rng, true);
    let b = render(&tree, rng, true);
    let (fa, fb) = (fingerprint(&a), fingerprint(&b));
    assert_eq!(fa, expected, "not the documented canonical form: {a:?}");
    assert_eq!(
        fb, expected,
        "not the documented canonical form (reordered): {b:?}"
    );
    let value_a = serde_json::from_str::<serde_json::Value>(&a);
    match &value_a {
        Ok(value) => assert_eq!(
            serde_json::from_str::<serde_json::Value>(&b).ok().as_ref(),
            Some(value),
            "generator: a reordering changed the value: {a} vs {b}"
        ),
        Err(err) => assert!(serde_refuses_valid_json(err), "generator: {err}: {a}"),
    }

    // A changed tree: its fingerprint is its own canonical form's, and differs from the
    // original's whenever serde_json sees a different value.
    let mut changed = tree.clone();
    change(rng, &mut changed);
    let c = render(&changed, rng, true);
    let fc = fingerprint(&c);
    assert_eq!(
        fc,
        canonical_digest(&changed),
        "not the documented canonical form (changed): {c:?}"
    );
    if let (Ok(value_a), Ok(value_c)) = (&value_a, serde_json::from_str::<serde_json::Value>(&c)) {
        assert!(
            value_a == &value_c || fa != fc,
            "different values, one fingerprint: {a} and {c}"
        );
    }

    // A byte-level mutation: JSON for the fingerprint exactly when JSON for serde_json.
    let mut bytes = a.clone().into_bytes();
    mutate_bytes(rng, &mut bytes);
    let fm = Fingerprint::compute(FingerprintMode::Json, &Method::POST, "/p", None, &bytes);
    let fallback = frame(JSON_TAG, "POST", "/p", None, Some(0), &bytes);
    let ours = fm.digest != fallback;
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(value_m) => {
            assert!(
                ours,
                "valid JSON taken as not JSON: {:?}",
                String::from_utf8_lossy(&bytes)
            );
            if let Ok(value_a) = &value_a {
                assert!(
                    value_a == &value_m || fm != fa,
                    "different values, one fingerprint: {a} and {:?}",
                    String::from_utf8_lossy(&bytes)
                );
            }
        }
        Err(err) if !serde_refuses_valid_json(&err) => assert!(
            !ours,
            "invalid JSON ({err}) taken as JSON: {:?}",
            String::from_utf8_lossy(&bytes)
        ),
        Err(_) => {}
    }
    if ours {
        Verdict::Accepted
    } else {
        Verdict::Refused
    }
}

fn fingerprint(text: &str) -> Fingerprint {
    Fingerprint::compute(
        FingerprintMode::Json,
        &Method::POST,
        "/p",
        None,
        text.as_bytes(),
    )
}

/// The documented JSON-mode digest of `tree` posted to `/p`.
fn canonical_digest(tree: &Json) -> Fingerprint {
    let mut canonical = String::new();
    write_canonical(tree, &mut canonical);
    Fingerprint {
        version: 2,
        digest: frame(JSON_TAG, "POST", "/p", None, Some(1), canonical.as_bytes()),
    }
}

/// The canonical form, as the module docs specify it. Sorting code point sequences is
/// sorting their UTF-8 bytes, lone surrogates (three bytes each) included.
fn write_canonical(tree: &Json, out: &mut String) {
    match tree {
        Json::Token(token) => out.push_str(token),
        Json::Str(s) => {
            out.push('"');
            out.push_str(&s.raw);
            out.push('"');
        }
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Json::Object(members) => {
            let mut sorted: Vec<&(JsonString, Json)> = members.iter().collect();
            sorted.sort_by(|x, y| x.0.decoded.cmp(&y.0.decoded)); // stable
            out.push('{');
            for (i, (key, value)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push('"');
                out.push_str(&key.raw);
                out.push_str("\":");
                write_canonical(value, out);
            }
            out.push('}');
        }
    }
}

/// Renders `tree` with random whitespace; with `shuffle`, object members in a random
/// order that keeps members with equal decoded keys in their order (which decides the
/// value a parser keeps).
fn render(tree: &Json, rng: &mut Rng, shuffle: bool) -> String {
    let mut out = String::new();
    let spacing = rng.below(3); // none, some, a lot
    ws(rng, spacing, &mut out);
    render_into(tree, rng, shuffle, spacing, &mut out);
    ws(rng, spacing, &mut out);
    out
}

fn render_into(tree: &Json, rng: &mut Rng, shuffle: bool, spacing: usize, out: &mut String) {
    match tree {
        Json::Token(token) => out.push_str(token),
        Json::Str(s) => {
            out.push('"');
            out.push_str(&s.raw);
            out.push('"');
        }
        Json::Array(items) => {
            out.push('[');
            ws(rng, spacing, out);
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                    ws(rng, spacing, out);
                }
                render_into(item, rng, shuffle, spacing, out);
                ws(rng, spacing, out);
            }
            out.push(']');
        }
        Json::Object(members) => {
            let order = if shuffle {
                allowed_order(rng, members)
            } else {
                (0..members.len()).collect()
            };
            out.push('{');
            ws(rng, spacing, out);
            for (i, &m) in order.iter().enumerate() {
                let (key, value) = &members[m];
                if i > 0 {
                    out.push(',');
                    ws(rng, spacing, out);
                }
                out.push('"');
                out.push_str(&key.raw);
                out.push('"');
                ws(rng, spacing, out);
                out.push(':');
                ws(rng, spacing, out);
                render_into(value, rng, shuffle, spacing, out);
                ws(rng, spacing, out);
            }
            out.push('}');
        }
    }
}

/// A random order of `members` in which members with equal decoded keys keep their
/// relative order.
fn allowed_order(rng: &mut Rng, members: &[(JsonString, Json)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..members.len()).collect();
    rng.shuffle(&mut order);
    let mut done = vec![false; members.len()];
    for first in 0..members.len() {
        if done[first] {
            continue;
        }
        let group: Vec<usize> = (first..members.len())
            .filter(|&m| members[m].0.decoded == members[first].0.decoded)
            .collect();
        let mut slots: Vec<usize> = (0..order.len())
            .filter(|&slot| group.contains(&order[slot]))
            .collect();
        slots.sort_unstable();
        for (&slot, &m) in slots.iter().zip(&group) {
            order[slot] = m;
            done[m] = true;
        }
    }
    order
}

fn ws(rng: &mut Rng, spacing: usize, out: &mut String) {
    if spacing == 0 || rng.below(3) > spacing {
        return;
    }
    for _ in 0..rng.between(1, 2 * spacing) {
        out.push(*rng.pick(&[' ', '\t', '\n', '\r']));
    }
}

fn value(rng: &mut Rng, depth: usize) -> Json {
    if depth == 0 || rng.one_in(3) {
        return scalar(rng);
    }
    let len = if rng.one_in(5) { 0 } else { rng.between(1, 5) };
    if rng.one_in(2) {
        Json::Array((0..len).map(|_| value(rng, depth - 1)).collect())
    } else {
        Json::Object(
            (0..len)
                .map(|_| (key(rng), value(rng, depth - 1)))
                .collect(),
        )
    }
}

/// Nesting far beyond serde_json's limit (and any recursive parser's stack).
fn deep(rng: &mut Rng) -> Json {
    let mut tree = scalar(rng);
    for _ in 0..rng.between(129, 3_000) {
        tree = if rng.one_in(2) {
            Json::Array(vec![tree])
        } else {
            Json::Object(vec![(key(rng), tree)])
        };
    }
    tree
}

fn scalar(rng: &mut Rng) -> Json {
    match rng.below(8) {
        0 => Json::Token((*rng.pick(&["null", "true", "false"])).to_owned()),
        1..=3 => Json::Token(number(rng)),
        _ => Json::Str(string(rng, 0, 12)),
    }
}

/// A number by the RFC 8259 grammar, sometimes beyond f64.
fn number(rng: &mut Rng) -> String {
    let mut n = String::new();
    if rng.one_in(3) {
        n.push('-');
    }
    let digits = |rng: &mut Rng, n: &mut String, count: usize| {
        for _ in 0..count {
            n.push(char::from(b'0' + rng.below(10) as u8));
        }
    };
    if rng.one_in(3) {
        n.push('0');
    } else {
        n.push(char::from(b'1' + rng.below(9) as u8));
        let count = if rng.one_in(20) {
            rng.between(15, 30)
        } else {
            rng.below(4)
        };
        digits(rng, &mut n, count);
    }
    if rng.one_in(3) {
        n.push('.');
        let count = rng.between(1, 4);
        digits(rng, &mut n, count);
    }
    if rng.one_in(4) {
        n.push(*rng.pick(&['e', 'E']));
        if rng.one_in(2) {
            n.push(*rng.pick(&['+', '-']));
        }
        let count = if rng.one_in(20) { 3 } else { rng.between(1, 2) };
        digits(rng, &mut n, count);
    }
    n
}

/// Keys: often from a pool of keys that collide when decoded, to make duplicates.
fn key(rng: &mut Rng) -> JsonString {
    const POOL: &[&str] = &[
        "a",
        "\\u0061",
        "b",
        "A",
        "\\u0041",
        "",
        "ab",
        "a b",
        "é",
        "\\u00e9",
        "\\u00E9",
        "😀",
        "\\ud83d\\ude00",
        "\\uD83D\\uDE00",
        "\\ud83d",
        "\\/",
        "/",
        "\\n",
        "\\u000a",
        "a\\u0000",
        "\\uffff",
        "\u{ffff}",
    ];
    if rng.one_in(2) {
        JsonString::new((*rng.pick(POOL)).to_owned())
    } else {
        string(rng, 0, 4)
    }
}

/// String text: plain and multi-byte characters, every escape, surrogate pairs, and
/// now and then a lone surrogate.
fn string(rng: &mut Rng, min: usize, max: usize) -> JsonString {
    let mut raw = String::new();
    for _ in 0..rng.between(min, max) {
        match rng.below(12) {
            0..=4 => raw.push(*rng.pick(&['a', 'b', 'A', ' ', '0', '\'', '\u{7f}'])),
            5 => raw.push(*rng.pick(&['é', 'ß', '€', '中', '😀', '\u{ffff}', '\u{10ffff}'])),
            6 => raw.push_str(
                rng.pick::<&str>(&["\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t"]),
            ),
            7 | 8 => {
                let code = loop {
                    let code = if rng.one_in(2) {
                        rng.below(0x80)
                    } else {
                        rng.below(0x1_0000)
                    };
                    if !(0xD800..0xE000).contains(&code) {
                        break code;
                    }
                };
                raw.push_str(&hex_escape(rng, code as u32));
            }
            9 | 10 => {
                let code = 0x1_0000 + rng.below(0x10_0000) as u32;
                let high = 0xD800 + ((code - 0x1_0000) >> 10);
                let low = 0xDC00 + ((code - 0x1_0000) & 0x3FF);
                raw.push_str(&hex_escape(rng, high));
                raw.push_str(&hex_escape(rng, low));
            }
            _ if rng.one_in(8) => {
                let lone = 0xD800 + rng.below(0x800) as u32;
                raw.push_str(&hex_escape(rng, lone));
            }
            _ => raw.push('z'),
        }
    }
    JsonString::new(raw)
}

fn hex_escape(rng: &mut Rng, code: u32) -> String {
    if rng.one_in(2) {
        format!("\\u{code:04x}")
    } else {
        format!("\\u{code:04X}")
    }
}

/// What a valid JSON string's text decodes to, by RFC 8259: a high surrogate escape
/// directly followed by a low one is one character; any other surrogate stays alone.
fn decode(raw: &str) -> Vec<u32> {
    let bytes = raw.as_bytes();
    let hex = |at: usize| u32::from_str_radix(&raw[at..at + 4], 16).expect("generated hex");
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            let c = raw[i..].chars().next().expect("in bounds");
            out.push(u32::from(c));
            i += c.len_utf8();
            continue;
        }
        let (code, used) = match bytes[i + 1] {
            b'u' => {
                let first = hex(i + 2);
                let pair = (0xD800..0xDC00).contains(&first)
                    && raw[i + 6..].starts_with("\\u")
                    && (0xDC00..0xE000).contains(&hex(i + 8));
                if pair {
                    (
                        0x1_0000 + ((first - 0xD800) << 10) + (hex(i + 8) - 0xDC00),
                        12,
                    )
                } else {
                    (first, 6)
                }
            }
            b'b' => (8, 2),
            b'f' => (12, 2),
            b'n' => (10, 2),
            b'r' => (13, 2),
            b't' => (9, 2),
            other => (u32::from(other), 2),
        };
        out.push(code);
        i += used;
    }
    out
}

/// Changes `tree` at one random node: a new scalar, a respelling, a swap, a removal, a
/// duplicate key, a wrapper.
fn change(rng: &mut Rng, tree: &mut Json) {
    let target = rng.below(count(tree));
    let mut seen = 0;
    change_at(rng, tree, target, &mut seen);
}

fn count(tree: &Json) -> usize {
    1 + match tree {
        Json::Array(items) => items.iter().map(count).sum(),
        Json::Object(members) => members.iter().map(|(_, v)| count(v)).sum(),
        _ => 0,
    }
}

fn change_at(rng: &mut Rng, tree: &mut Json, target: usize, seen: &mut usize) -> bool {
    if *seen == target {
        apply(rng, tree);
        return true;
    }
    *seen += 1;
    match tree {
        Json::Array(items) => items
            .iter_mut()
            .any(|item| change_at(rng, item, target, seen)),
        Json::Object(members) => members
            .iter_mut()
            .any(|(_, value)| change_at(rng, value, target, seen)),
        _ => false,
    }
}

fn apply(rng: &mut Rng, node: &mut Json) {
    match (rng.below(6), &mut *node) {
        (0, Json::Token(token)) if token.contains(|c: char| c.is_ascii_digit()) => {
            // Same number for serde_json sometimes, never the same spelling.
            let at = token.find(['e', 'E']).unwrap_or(token.len());
            let more = if token.contains('.') { "0" } else { ".0" };
            token.insert_str(at, more);
        }
        (0, Json::Str(s)) => {
            let tail = *rng.pick(&["\\u0041", "A", "\\/", "é"]);
            let raw = format!("{}{tail}", s.raw);
            *s = JsonString::new(raw);
        }
        (1, Json::Array(items)) if items.len() >= 2 => {
            let (i, j) = (rng.below(items.len()), rng.below(items.len()));
            items.swap(i, j);
        }
        (1, Json::Object(members)) if members.len() >= 2 => {
            // Swapping two members: a new value when their keys decode alike.
            let (i, j) = (rng.below(members.len()), rng.below(members.len()));
            members.swap(i, j);
        }
        (2, Json::Array(items)) if !items.is_empty() => {
            items.remove(rng.below(items.len()));
        }
        (2, Json::Object(members)) if !members.is_empty() => {
            members.remove(rng.below(members.len()));
        }
        (3, Json::Object(members)) => {
            // A key that decodes like an existing one, spelled another way when possible.
            let key = match members.first() {
                Some((first, _)) if first.raw == "a" => JsonString::new("\\u0061".to_owned()),
                Some((first, _)) => first.clone(),
                None => key(rng),
            };
            let at = rng.below(members.len() + 1);
            members.insert(at, (key, scalar(rng)));
        }
        (4, _) => *node = Json::Array(vec![node.clone()]),
        _ => *node = scalar(rng),
    }
}

/// Inserts, removes or replaces one byte, from an alphabet of JSON's structure.
fn mutate_bytes(rng: &mut Rng, bytes: &mut Vec<u8>) {
    let at = rng.below(bytes.len() + 1);
    let byte = if rng.one_in(8) {
        rng.byte()
    } else {
        *rng.pick(b"{}[]:,\"\\ 0.eE+-tu\x01\x7fdD8")
    };
    match rng.below(3) {
        0 => bytes.insert(at, byte),
        1 if at < bytes.len() => {
            bytes.remove(at);
        }
        _ if at < bytes.len() => bytes[at] = byte,
        _ => bytes.push(byte),
    }
}
