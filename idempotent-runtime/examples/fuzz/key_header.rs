//! Target `key`: `key::parse_header` against a model written from the rules in the `key`
//! module docs, on mutated valid headers, length boundaries, lists, parameters and raw
//! bytes. Every answer must be the model's (same key, or same error kind), every accepted
//! key must round-trip through `key::quote`, and nothing may panic.

use http::{HeaderMap, HeaderName, HeaderValue};
use idempotent_runtime::key::{KeyError, MAX_KEY_LEN, parse_header, quote};

use super::Verdict;
use super::rng::Rng;

/// Bytes that carry meaning to the parser, drawn far more often than chance would.
const INTERESTING: &[u8] = b"\"\\ \t,;=*:-_a0Z~\x7f\x80\xff\x00\x01";

/// One generated request: its `Idempotency-Key` fields (none, one or several).
pub(crate) fn run(rng: &mut Rng) -> Verdict {
    let name = HeaderName::from_static("idempotency-key");
    let fields: Vec<Vec<u8>> = match rng.below(40) {
        0 => Vec::new(),
        1 => vec![field(rng), field(rng)],
        2 => (0..rng.between(3, 5)).map(|_| field(rng)).collect(),
        _ => vec![field(rng)],
    };
    let mut headers = HeaderMap::new();
    // Unrelated fields, including one whose name only starts like ours.
    if rng.one_in(4) {
        headers.insert("idempotency", HeaderValue::from_static("other"));
    }
    let mut representable = 0;
    for value in &fields {
        // Bytes a `HeaderValue` cannot hold (CR, LF, NUL, DEL, …) never reach a parser
        // behind hyper; they are refused here, as hyper refuses them.
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.append(&name, value);
            representable += 1;
        }
    }
    let got = parse_header(&headers, &name);
    let expected = match representable {
        0 => Err(KeyError::Missing),
        1 => model(headers.get(&name).expect("one field").as_bytes()),
        _ => Err(KeyError::Multiple),
    };
    let same = match (&got, &expected) {
        (Err(KeyError::MalformedQuoting(_)), Err(KeyError::MalformedQuoting(_))) => true,
        _ => got == expected,
    };
    assert!(
        same,
        "fields {fields:?}: parse_header gave {got:?}, the documented rules give {expected:?}"
    );
    // Error messages are built without panicking.
    if let Err(err) = &got {
        assert!(!err.to_string().is_empty());
        return Verdict::Refused;
    }
    let key = got.expect("accepted");
    let mut quoted = HeaderMap::new();
    quoted.insert(
        &name,
        HeaderValue::from_str(&quote(&key)).expect("a quoted key is a header value"),
    );
    assert_eq!(
        parse_header(&quoted, &name).as_deref(),
        Ok(key.as_str()),
        "quote({key:?}) does not parse back"
    );
    Verdict::Accepted
}

/// One field value: mostly valid headers, mutated or not; sometimes raw bytes.
fn field(rng: &mut Rng) -> Vec<u8> {
    let mut value = match rng.below(10) {
        0..=3 => quote(&key_text(rng)).into_bytes(),
        4..=6 => bare_key(rng),
        7 => boundary_key(rng),
        8 => structured(rng),
        _ => (0..rng.below(24))
            .map(|_| {
                if rng.one_in(2) {
                    rng.byte()
                } else {
                    *rng.pick(INTERESTING)
                }
            })
            .collect(),
    };
    for _ in 0..[0, 0, 1, 1, 2, 3][rng.below(6)] {
        mutate(rng, &mut value);
    }
    if rng.one_in(4) {
        let ows =
            |rng: &mut Rng| -> Vec<u8> { (0..rng.below(3)).map(|_| *rng.pick(b" \t")).collect() };
        let mut padded = ows(rng);
        padded.extend_from_slice(&value);
        padded.extend(ows(rng));
        value = padded;
    }
    value
}

/// Key text (before quoting): printable ASCII with many quotes, backslashes and spaces.
fn key_text(rng: &mut Rng) -> String {
    let len = match rng.below(8) {
        0 => rng.below(3),
        1 => rng.between(MAX_KEY_LEN - 2, MAX_KEY_LEN + 2),
        _ => rng.between(1, 40),
    };
    (0..len)
        .map(|_| match rng.below(6) {
            0 => char::from(*rng.pick(b"\"\\ ")),
            _ => char::from(rng.between(0x20, 0x7E) as u8),
        })
        .collect()
}

/// A bare key: UUIDs, tokens, base64, and visible ASCII.
fn bare_key(rng: &mut Rng) -> Vec<u8> {
    match rng.below(3) {
        0 => {
            let hex = |rng: &mut Rng, n: usize| -> String {
                (0..n)
                    .map(|_| char::from(*rng.pick(b"0123456789abcdef")))
                    .collect()
            };
            format!(
                "{}-{}-{}-{}-{}",
                hex(rng, 8),
                hex(rng, 4),
                hex(rng, 4),
                hex(rng, 4),
                hex(rng, 12)
            )
            .into_bytes()
        }
        1 => (0..rng.between(1, 44))
            .map(|_| *rng.pick(b"ABCxyz0189+/="))
            .collect(),
        _ => (0..rng.between(1, 30))
            .map(|_| rng.between(0x21, 0x7E) as u8)
            .collect(),
    }
}

/// Keys at the length limit, counted after unquoting (escapes make the wire form longer).
fn boundary_key(rng: &mut Rng) -> Vec<u8> {
    let len = rng.between(MAX_KEY_LEN - 1, MAX_KEY_LEN + 1);
    let fill = *rng.pick(b"k\"\\ ");
    let mut key: String = (0..len)
        .map(|i| char::from(if i % 7 == 0 { fill } else { b'k' }))
        .collect();
    if rng.one_in(2) && !key.contains(['"', '\\', ' ']) {
        return key.into_bytes();
    }
    if rng.one_in(3) {
        key.insert(0, ' ');
    }
    quote(&key).into_bytes()
}

/// Structured-field look-alikes: lists, parameters, two strings, inner lists.
fn structured(rng: &mut Rng) -> Vec<u8> {
    let a = quote(&key_text(rng));
    let b = String::from_utf8_lossy(&bare_key(rng)).into_owned();
    match rng.below(6) {
        0 => format!("{a}, {b}"),
        1 => format!("{b},{b}"),
        2 => format!("{a};p=1"),
        3 => format!("{b};q=\"x\""),
        4 => format!("{a} {a}"),
        _ => format!("({a} {b})"),
    }
    .into_bytes()
}

fn mutate(rng: &mut Rng, value: &mut Vec<u8>) {
    let at = rng.below(value.len() + 1);
    let byte = if rng.one_in(3) {
        rng.byte()
    } else {
        *rng.pick(INTERESTING)
    };
    match rng.below(5) {
        0 => value.insert(at, byte),
        1 if at < value.len() => {
            value.remove(at);
        }
        2 if at < value.len() => value[at] = byte,
        3 => value.truncate(at),
        _ => {
            let end = rng.between(at, value.len());
            let copy = value[at..end].to_vec();
            value.splice(at..at, copy);
        }
    }
}

/// The rules of the `key` module docs, for one field value, written independently of
/// the parser.
fn model(raw: &[u8]) -> Result<String, KeyError> {
    let start = raw.iter().position(|b| !matches!(b, b' ' | b'\t'));
    let value = match start {
        None => &raw[..0],
        Some(start) => {
            let end = raw
                .iter()
                .rposition(|b| !matches!(b, b' ' | b'\t'))
                .expect("non-blank");
            &raw[start..=end]
        }
    };
    if value.iter().any(|b| !(0x20..=0x7E).contains(b)) {
        return Err(KeyError::InvalidCharacter);
    }
    let malformed = Err(KeyError::MalformedQuoting("model"));
    let key: Vec<u8> = if value.first() == Some(&b'"') {
        let mut key = Vec::new();
        let mut i = 1;
        let mut closed = false;
        while i < value.len() {
            match value[i] {
                b'\\' => match value.get(i + 1) {
                    Some(&c @ (b'"' | b'\\')) => {
                        key.push(c);
                        i += 2;
                    }
                    _ => return malformed,
                },
                b'"' => {
                    if i + 1 != value.len() {
                        return malformed;
                    }
                    closed = true;
                    break;
                }
                c => {
                    key.push(c);
                    i += 1;
                }
            }
        }
        if !closed {
            return malformed;
        }
        key
    } else {
        if value.iter().any(|b| matches!(b, b' ' | b',' | b';' | b'"')) {
            return malformed;
        }
        value.to_vec()
    };
    if key.iter().all(|&b| b == b' ') {
        return Err(KeyError::Blank);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong { len: key.len() });
    }
    Ok(String::from_utf8(key).expect("printable ASCII"))
}
