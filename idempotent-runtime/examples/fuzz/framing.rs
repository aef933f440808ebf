//! Target `framing`: `Fingerprint::compute` against the framing the `fingerprint` module
//! docs specify (recomputed here with SHA-256), and the framing's promise that moving
//! bytes between method, path, query and body always changes the digest.

use http::Method;
use idempotent_runtime::{Fingerprint, FingerprintMode};
use sha2::{Digest, Sha256};

use super::Verdict;
use super::rng::Rng;

/// Method, path, query and body of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Request {
    method: Method,
    path: String,
    query: Option<String>,
    body: Vec<u8>,
}

impl Request {
    fn fingerprint(&self, mode: FingerprintMode) -> Fingerprint {
        Fingerprint::compute(
            mode,
            &self.method,
            &self.path,
            self.query.as_deref(),
            &self.body,
        )
    }
}

/// `Accepted` when the JSON-mode fingerprint used the canonical form (the body is JSON),
/// `Refused` when it fell back to the raw bytes.
pub(crate) fn run(rng: &mut Rng) -> Verdict {
    let request = request(rng);
    let raw = request.fingerprint(FingerprintMode::Raw);
    assert_eq!(raw.version, 1);
    assert_eq!(
        raw.digest,
        documented(&request, b"idempotent/fingerprint/v1/raw", None),
        "raw framing differs from the documented one for {request:?}"
    );
    let json = request.fingerprint(FingerprintMode::Json);
    assert_eq!(json.version, 2);
    assert_ne!(
        raw.digest, json.digest,
        "raw and JSON modes collide for {request:?}"
    );
    // The JSON-mode framing of a body taken as not JSON (marker byte 0).
    let fallback = documented(&request, JSON_TAG, Some(0));
    let canonical = json.digest != fallback;
    // Whether the body is JSON, by serde_json where serde_json decides it: it refuses
    // valid JSON with numbers beyond f64, lone surrogates or more than 128 levels.
    match serde_json::from_slice::<serde_json::Value>(&request.body) {
        Ok(_) => assert!(
            canonical,
            "valid JSON fingerprinted as raw bytes: {request:?}"
        ),
        Err(err) if !super::json::serde_refuses_valid_json(&err) => assert!(
            !canonical,
            "invalid JSON ({err}) fingerprinted as canonical JSON: {request:?}"
        ),
        Err(_) => {}
    }
    // Same request, same digest; any change to one field, or bytes moved from one field
    // to the next, gives a different digest.
    assert_eq!(request.clone().fingerprint(FingerprintMode::Raw), raw);
    let (other, body_only) = shifted(rng, &request);
    if other != request {
        // In JSON mode a body change may be whitespace, which JSON mode ignores.
        let modes: &[FingerprintMode] = if body_only {
            &[FingerprintMode::Raw]
        } else {
            &[FingerprintMode::Raw, FingerprintMode::Json]
        };
        for &mode in modes {
            assert_ne!(
                request.fingerprint(mode),
                other.fingerprint(mode),
                "{mode:?} collision: {request:?} and {other:?}"
            );
        }
    }
    if canonical {
        Verdict::Accepted
    } else {
        Verdict::Refused
    }
}

/// The JSON-mode tag.
pub(crate) const JSON_TAG: &[u8] = b"idempotent/fingerprint/v2/json";

fn documented(request: &Request, tag: &[u8], marker: Option<u8>) -> [u8; 32] {
    frame(
        tag,
        request.method.as_str(),
        &request.path,
        request.query.as_deref(),
        marker,
        &request.body,
    )
}

/// The framing as the module docs state it: `field(x)` is `len(x)` as u64 big-endian,
/// then `x`; the body is `field(body)` (raw mode) or `marker` then `field(body)` (JSON
/// mode: `1` and the canonical text, or `0` and the raw bytes of a body that is not JSON).
pub(crate) fn frame(
    tag: &[u8],
    method: &str,
    path: &str,
    query: Option<&str>,
    marker: Option<u8>,
    body: &[u8],
) -> [u8; 32] {
    fn field(hasher: &mut Sha256, bytes: &[u8]) {
        hasher.update((bytes.len() as u64).to_be_bytes());
        hasher.update(bytes);
    }
    let mut hasher = Sha256::new();
    field(&mut hasher, tag);
    field(&mut hasher, method.as_bytes());
    field(&mut hasher, path.as_bytes());
    match query {
        None => hasher.update([0]),
        Some(query) => {
            hasher.update([1]);
            field(&mut hasher, query.as_bytes());
        }
    }
    if let Some(marker) = marker {
        hasher.update([marker]);
    }
    field(&mut hasher, body);
    hasher.finalize().into()
}

fn request(rng: &mut Rng) -> Request {
    let method = match rng.below(8) {
        0 => Method::from_bytes(token(rng, 1, 12).as_bytes()).expect("a token is a method"),
        1 => Method::from_bytes(b"post").expect("lower-case method"),
        _ => rng
            .pick(&[
                Method::POST,
                Method::PUT,
                Method::PATCH,
                Method::DELETE,
                Method::GET,
            ])
            .clone(),
    };
    let path = text(rng, b"/ab%2F.-_~:@", 0, 30);
    let query = match rng.below(4) {
        0 => None,
        1 => Some(String::new()),
        _ => Some(text(rng, b"a=1&b=%20+;/?", 0, 30)),
    };
    let body = match rng.below(6) {
        0 => Vec::new(),
        1 => (0..rng.below(64)).map(|_| rng.byte()).collect(),
        2 => text(rng, b"{}[]:,\"\\ 0123456789.eE+-tfrnul", 0, 24).into_bytes(),
        _ => super::json::document(rng).into_bytes(),
    };
    Request {
        method,
        path,
        query,
        body,
    }
}

/// A copy of `request` with one field changed, or bytes moved across a field boundary;
/// and whether only the body changed.
fn shifted(rng: &mut Rng, request: &Request) -> (Request, bool) {
    let mut other = request.clone();
    match rng.below(7) {
        // Path tail → query head.
        0 if !other.path.is_empty() => {
            let at = floor_char(&other.path, rng.below(other.path.len()));
            let tail = other.path.split_off(at);
            other.query = Some(tail + other.query.as_deref().unwrap_or(""));
        }
        // Query tail → body head.
        1 if other.query.is_some() => {
            let query = other.query.as_mut().expect("some");
            let at = floor_char(query, rng.below(query.len() + 1));
            let tail = query.split_off(at);
            other.body.splice(0..0, tail.into_bytes());
        }
        // No query vs an empty one.
        2 => {
            other.query = match other.query {
                None => Some(String::new()),
                Some(q) if q.is_empty() => None,
                Some(q) => Some(q.chars().skip(1).collect()),
            }
        }
        // Path tail → method (methods are tokens).
        3 => {
            let method = format!("{}X", other.method);
            other.method = Method::from_bytes(method.as_bytes()).expect("a token");
            other.path = format!("X{}", other.path);
        }
        4 => {
            other.body.push(*rng.pick(b" }\n0"));
            return (other, true);
        }
        5 if !other.body.is_empty() => {
            let at = rng.below(other.body.len());
            other.body[at] ^= 1 << rng.below(8);
            return (other, true);
        }
        _ => other.path.push('/'),
    }
    (other, false)
}

fn floor_char(s: &str, mut at: usize) -> usize {
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn text(rng: &mut Rng, alphabet: &[u8], min: usize, max: usize) -> String {
    (0..rng.between(min, max))
        .map(|_| {
            if rng.one_in(16) {
                *rng.pick(&['é', '€', '😀', ' '])
            } else {
                char::from(*rng.pick(alphabet))
            }
        })
        .collect()
}

/// An RFC 9110 token: what a method may be.
fn token(rng: &mut Rng, min: usize, max: usize) -> String {
    (0..rng.between(min, max))
        .map(|_| char::from(*rng.pick(b"ABCXYZabcxyz!#$%&'*+-.^_`|~09")))
        .collect()
}
