//! Request fingerprints: what makes "the same request" under one idempotency key.
//!
//! A retry must be the same request as the original; a different request that reuses the
//! key is refused (`422 idempotency_key_reused`). The fingerprint decides what "same"
//! means: a SHA-256 digest over a versioned, length-prefixed framing of the request.
//!
//! # What is in the fingerprint
//!
//! Fed to SHA-256 in this order, where `field(x)` is the length of `x` as a `u64`
//! big-endian followed by the bytes of `x`:
//!
//! 1. `field(tag)`: the domain and version tag, `idempotent/fingerprint/v1/raw` or
//!    `idempotent/fingerprint/v2/json`. The mode is part of the tag, so a raw and a JSON
//!    fingerprint of the same request always differ;
//! 2. `field(method)`: the method as sent (`POST`; methods are case-sensitive);
//! 3. `field(path)`: the path exactly as given, not decoded or normalised (`/a%2Fb`,
//!    `/a/b` and `/a/b/` are three paths);
//! 4. the query: the byte `0` when the request has no query, or the byte `1` then
//!    `field(query)` when it has one — so `/p` and `/p?` (an empty query) differ. The
//!    query is taken as sent: parameter order and percent-encoding matter;
//! 5. the body:
//!    - raw mode ([`FingerprintMode::Raw`], version 1): `field(body)`, the raw bytes;
//!    - JSON mode ([`FingerprintMode::Json`], version 2): the byte `1` then
//!      `field(canonical JSON)` when the body is valid JSON, or the byte `0` then
//!      `field(body)` when it is not (see below).
//!
//! Because every variable-length part is length-prefixed and the order is fixed, no two
//! different requests share a framing: moving bytes between path, query and body always
//! changes the digest.
//!
//! # What is not in the fingerprint
//!
//! - **No headers**, none at all: not `Content-Type`, not `Authorization`, not
//!   `Idempotency-Key` itself. A retry may carry a new trace id, date or token. (Who the
//!   caller is goes into the key's *scope*, not the fingerprint.)
//! - No scheme, host or port, and no HTTP version.
//! - In JSON mode, the body's object key order and insignificant whitespace.
//!
//! # Canonical JSON (mode `json`)
//!
//! The canonical form is computed from the raw text, never from a parsed-and-reserialised
//! model, so that only formatting is forgiven and every value stays as written:
//!
//! - whitespace between tokens is dropped;
//! - object members are stably sorted by their key *as decoded* (escapes replaced by the
//!   characters they stand for), bytewise in UTF-8; members whose keys decode alike —
//!   duplicates, or `"a"` and `"\u0061"` — are all kept, in their original order, since
//!   that order decides which one a parser keeps. Keys are then written as they were
//!   sent, escapes included;
//! - arrays keep their order;
//! - numbers are kept as written: `1.0`, `1` and `1e0` are three different values;
//! - strings are kept as written, escapes included: `"\u0041"` and `"A"` differ, and so do
//!   `"\/"` and `"/"`.
//!
//! A body that is not one valid JSON text (RFC 8259, UTF-8, no byte-order mark, exactly
//! one value surrounded by optional whitespace) — including an empty body — is
//! fingerprinted by its raw bytes instead, still under the JSON tag but with a different
//! marker byte, so an invalid body can never collide with the canonical form of a valid
//! one. Such bodies are normally refused by the handler's `Json` extractor anyway.
//!
//! The parser keeps its own stack, so deeply nested documents cannot overflow the thread's
//! stack.

use sha2::{Digest, Sha256};

/// How a request body is fingerprinted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FingerprintMode {
    /// The raw body bytes (default): any byte difference is a different request.
    #[default]
    Raw,
    /// A canonical form of the JSON body: object key order and insignificant whitespace
    /// are ignored; numbers and strings are compared exactly as written. See the
    /// [module docs](self).
    Json,
}

impl FingerprintMode {
    /// The algorithm version recorded with fingerprints made in this mode.
    pub const fn version(self) -> i16 {
        match self {
            Self::Raw => 1,
            Self::Json => 2,
        }
    }

    fn tag(self) -> &'static [u8] {
        match self {
            Self::Raw => b"idempotent/fingerprint/v1/raw",
            Self::Json => b"idempotent/fingerprint/v2/json",
        }
    }
}

/// A SHA-256 fingerprint of a request, with the version of the algorithm that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    /// The algorithm version (stored with the record so the algorithm can change):
    /// `1` for [`FingerprintMode::Raw`], `2` for [`FingerprintMode::Json`].
    pub version: i16,
    /// The SHA-256 digest.
    pub digest: [u8; 32],
}

impl Fingerprint {
    /// Fingerprints a request: its method, path, query (`None` when the request has no
    /// `?`) and body. See the [module docs](self) for exactly what is hashed.
    ///
    /// ```
    /// use http::Method;
    /// use idempotent_runtime::{Fingerprint, FingerprintMode};
    ///
    /// let a = Fingerprint::compute(FingerprintMode::Json, &Method::POST, "/payments", None,
    ///                              br#"{"amount": 100, "currency": "EUR"}"#);
    /// let b = Fingerprint::compute(FingerprintMode::Json, &Method::POST, "/payments", None,
    ///                              br#"{"currency":"EUR","amount":100}"#);
    /// assert_eq!(a, b);
    /// assert_eq!(a.version, 2);
    /// ```
    pub fn compute(
        mode: FingerprintMode,
        method: &http::Method,
        path: &str,
        query: Option<&str>,
        body: &[u8],
    ) -> Self {
        let mut hasher = Sha256::new();
        field(&mut hasher, mode.tag());
        field(&mut hasher, method.as_str().as_bytes());
        field(&mut hasher, path.as_bytes());
        match query {
            None => hasher.update([0]),
            Some(query) => {
                hasher.update([1]);
                field(&mut hasher, query.as_bytes());
            }
        }
        match mode {
            FingerprintMode::Raw => field(&mut hasher, body),
            FingerprintMode::Json => match canonical_json(body) {
                Some(canonical) => {
                    hasher.update([1]);
                    field(&mut hasher, &canonical);
                }
                None => {
                    hasher.update([0]);
                    field(&mut hasher, body);
                }
            },
        }
        Self {
            version: mode.version(),
            digest: hasher.finalize().into(),
        }
    }
}

impl Fingerprint {
    /// Fingerprints a message's payload, byte for byte: what a queue consumer or a plain
    /// function run through [`Idempotency::once`](crate::Idempotency::once) hands the
    /// engine. Its own framing (tag `idempotent/fingerprint/v1/payload`) keeps it apart
    /// from every request fingerprint; its `version` is `1`, compared by digest alike.
    ///
    /// ```
    /// use idempotent_runtime::Fingerprint;
    ///
    /// let a = Fingerprint::of_payload(br#"{"amount":100}"#);
    /// assert_eq!(a, Fingerprint::of_payload(br#"{"amount":100}"#));
    /// assert_ne!(a, Fingerprint::of_payload(br#"{"amount":101}"#));
    /// ```
    pub fn of_payload(payload: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        field(&mut hasher, b"idempotent/fingerprint/v1/payload");
        field(&mut hasher, payload);
        Self {
            version: 1,
            digest: hasher.finalize().into(),
        }
    }

    /// Fingerprints a value by its JSON: [`of_payload`](Self::of_payload) of the
    /// canonical form (object keys sorted, no insignificant whitespace) of
    /// `serde_json::to_vec(value)`, so that a map's iteration order (a `HashMap` field)
    /// does not make the same value two payloads. What `#[idempotent(payload = order)]`
    /// hands the engine. Fails only when `value` does not serialise (a map with keys
    /// that are not strings, a `Serialize` impl that fails).
    ///
    /// ```
    /// use std::collections::HashMap;
    ///
    /// use idempotent_runtime::Fingerprint;
    ///
    /// let a: HashMap<&str, u32> = [("tea", 2), ("cake", 1)].into();
    /// let b: HashMap<&str, u32> = [("cake", 1), ("tea", 2)].into();
    /// assert_eq!(Fingerprint::of_json(&a).unwrap(), Fingerprint::of_json(&b).unwrap());
    /// assert_eq!(
    ///     Fingerprint::of_json(&a).unwrap(),
    ///     Fingerprint::of_payload(br#"{"cake":1,"tea":2}"#),
    /// );
    /// ```
    pub fn of_json<T: serde::Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        let json = serde_json::to_vec(value)?;
        // serde_json's own output is always one valid JSON text; the fallback is for
        // a `Serialize` impl that writes raw values, and keeps the bytes as they are.
        Ok(Self::of_payload(&canonical_json(&json).unwrap_or(json)))
    }
}

/// A request's fingerprint, computed when first needed, with the request it is computed
/// from (method, path, query and body).
///
/// What the `#[idempotent]` expansion and [`IdempotencyLayer`](crate::layer::IdempotencyLayer)
/// hand the engine. A replay the engine's replay cache answers is compared with the
/// request the cache saw, byte for byte, before anything is hashed: equal bytes are the
/// same request in either mode, so only a request whose bytes differ (a new one, or the
/// same JSON written differently) pays for SHA-256. Built from a [`Fingerprint`] (what
/// [`Idempotency::run`](crate::engine::Idempotency::run) callers pass), it carries no request and
/// is always compared by digest.
#[derive(Debug)]
pub struct RequestFingerprint {
    request: Option<FingerprintedRequest>,
    computed: std::sync::OnceLock<Fingerprint>,
}

/// The parts of a request its fingerprint is computed from.
#[derive(Debug)]
struct FingerprintedRequest {
    mode: FingerprintMode,
    method: http::Method,
    uri: http::Uri,
    body: bytes::Bytes,
}

impl RequestFingerprint {
    /// The fingerprint of a request with `method`, `uri` (its path and query) and `body`,
    /// in `mode`; nothing is hashed until [`get`](Self::get).
    pub fn new(
        mode: FingerprintMode,
        method: http::Method,
        uri: http::Uri,
        body: bytes::Bytes,
    ) -> Self {
        Self {
            request: Some(FingerprintedRequest {
                mode,
                method,
                uri,
                body,
            }),
            computed: std::sync::OnceLock::new(),
        }
    }

    /// The fingerprint ([`Fingerprint::compute`] of the request), computed once.
    pub fn get(&self) -> Fingerprint {
        *self.computed.get_or_init(|| {
            let request = self
                .request
                .as_ref()
                .expect("a RequestFingerprint without its request was built computed");
            Fingerprint::compute(
                request.mode,
                &request.method,
                request.uri.path(),
                request.uri.query(),
                &request.body,
            )
        })
    }

    /// [`framed_after`](Self::framed_after) with nothing before the framing.
    #[cfg(test)]
    pub(crate) fn framed(&self, max: usize) -> Option<Box<[u8]>> {
        self.framed_after(&[], max)
    }

    /// `prefix` followed by the request's bytes, in one allocation, framed so that two
    /// requests frame alike exactly when their mode, method, path, query and body are
    /// equal; `None` without a request, or when the framing would be longer than `max`
    /// bytes.
    pub(crate) fn framed_after(&self, prefix: &[u8], max: usize) -> Option<Box<[u8]>> {
        let request = self.request.as_ref()?;
        let mut len = 0;
        request.frame(|part| len += part.len());
        if len > max {
            return None;
        }
        let mut framed = Vec::with_capacity(prefix.len() + len);
        framed.extend_from_slice(prefix);
        request.frame(|part| framed.extend_from_slice(part));
        Some(framed.into_boxed_slice())
    }

    /// Whether `framed` is this request's framing, as
    /// [`framed_after`](Self::framed_after) writes it after its prefix (never for a
    /// fingerprint built without its request).
    pub(crate) fn is_framed(&self, framed: &[u8]) -> bool {
        let Some(request) = &self.request else {
            return false;
        };
        let mut rest = framed;
        let mut equal = true;
        request.frame(|part| match rest.split_at_checked(part.len()) {
            Some((head, tail)) if equal && head == part => rest = tail,
            _ => equal = false,
        });
        equal && rest.is_empty()
    }
}

#[cfg(test)]
impl RequestFingerprint {
    /// Whether [`get`](Self::get) has hashed (or the fingerprint came computed).
    pub(crate) fn is_computed(&self) -> bool {
        self.computed.get().is_some()
    }
}

impl FingerprintedRequest {
    /// Calls `part` with the request's framing, piece by piece: the mode's tag, the
    /// method, the path, a marker for whether there is a query and the query, and the raw
    /// body, each length-prefixed, so that no two different requests frame alike.
    fn frame(&self, mut part: impl FnMut(&[u8])) {
        let mut field = |bytes: &[u8]| {
            part(&(bytes.len() as u64).to_be_bytes());
            part(bytes);
        };
        field(self.mode.tag());
        field(self.method.as_str().as_bytes());
        field(self.uri.path().as_bytes());
        match self.uri.query() {
            None => field(&[]),
            Some(query) => {
                field(b"?");
                field(query.as_bytes());
            }
        }
        field(&self.body);
    }
}

impl From<Fingerprint> for RequestFingerprint {
    fn from(fingerprint: Fingerprint) -> Self {
        Self {
            request: None,
            computed: std::sync::OnceLock::from(fingerprint),
        }
    }
}

/// Feeds `bytes` prefixed by its length as a `u64` big-endian.
fn field(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

/// A parsed JSON value; scalars and keys are spans of the raw text.
enum Node {
    /// A string, number, `true`, `false` or `null`, as written.
    Scalar(usize, usize),
    /// Indices of the items in the arena.
    Array(Vec<usize>),
    /// (key span without its quotes, value index), in document order.
    Object(Vec<(usize, usize, usize)>),
}

/// The canonical form of `body` (see the module docs), or `None` if `body` is not one
/// valid JSON text.
fn canonical_json(body: &[u8]) -> Option<Vec<u8>> {
    std::str::from_utf8(body).ok()?;
    let (arena, root) = Parser { src: body, pos: 0 }.parse()?;
    Some(emit(body, arena, root))
}

/// An open container while parsing.
struct Open {
    node: usize,
    is_object: bool,
    /// For an object, the span of the key whose value is being parsed.
    key: Option<(usize, usize)>,
}

struct Parser<'a> {
    src: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    /// Parses the whole input as one JSON text into an arena; returns it and the root.
    fn parse(mut self) -> Option<(Vec<Node>, usize)> {
        let mut arena: Vec<Node> = Vec::new();
        let mut stack: Vec<Open> = Vec::new();
        // Each turn parses one value (or opens a container and loops to its first value),
        // then attaches it to its parent and closes every container that ends after it.
        let root = 'value: loop {
            self.skip_ws();
            let mut done = arena.len();
            match *self.src.get(self.pos)? {
                open @ (b'{' | b'[') => {
                    let is_object = open == b'{';
                    arena.push(if is_object {
                        Node::Object(Vec::new())
                    } else {
                        Node::Array(Vec::new())
                    });
                    self.pos += 1;
                    self.skip_ws();
                    let close = if is_object { b'}' } else { b']' };
                    if self.src.get(self.pos) == Some(&close) {
                        self.pos += 1;
                    } else {
                        let key = if is_object { Some(self.key()?) } else { None };
                        stack.push(Open {
                            node: done,
                            is_object,
                            key,
                        });
                        continue 'value;
                    }
                }
                _ => {
                    let start = self.pos;
                    self.scalar()?;
                    arena.push(Node::Scalar(start, self.pos));
                }
            }
            // `done` is a complete value.
            loop {
                let Some(open) = stack.last_mut() else {
                    break 'value done;
                };
                match &mut arena[open.node] {
                    Node::Array(items) => items.push(done),
                    Node::Object(members) => {
                        let (start, end) = open.key.take()?;
                        members.push((start, end, done));
                    }
                    Node::Scalar(..) => unreachable!("only containers are opened"),
                }
                self.skip_ws();
                match (*self.src.get(self.pos)?, open.is_object) {
                    (b',', is_object) => {
                        self.pos += 1;
                        if is_object {
                            open.key = Some(self.key()?);
                        }
                        continue 'value;
                    }
                    (b'}', true) | (b']', false) => {
                        self.pos += 1;
                        done = open.node;
                        stack.pop();
                    }
                    _ => return None,
                }
            }
        };
        self.skip_ws();
        (self.pos == self.src.len()).then_some((arena, root))
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.src.get(self.pos) {
            self.pos += 1;
        }
    }

    /// An object key and its `:`; returns the span between the quotes.
    fn key(&mut self) -> Option<(usize, usize)> {
        self.skip_ws();
        let start = self.pos;
        if self.src.get(self.pos) != Some(&b'"') {
            return None;
        }
        self.string()?;
        let end = self.pos;
        self.skip_ws();
        if self.src.get(self.pos) != Some(&b':') {
            return None;
        }
        self.pos += 1;
        Some((start + 1, end - 1))
    }

    /// A string, number or literal at `pos`.
    fn scalar(&mut self) -> Option<()> {
        match *self.src.get(self.pos)? {
            b'"' => self.string(),
            b'-' | b'0'..=b'9' => self.number(),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.src[self.pos..]
            .starts_with(word)
            .then(|| self.pos += word.len())
    }

    /// A string starting at the `"` at `pos`; the input is known to be valid UTF-8.
    fn string(&mut self) -> Option<()> {
        self.pos += 1;
        loop {
            // Skip plain characters in one pass; stop at a quote, backslash or control.
            let plain = self.src[self.pos..]
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
            self.pos += plain;
            match self.src[self.pos] {
                b'"' => {
                    self.pos += 1;
                    return Some(());
                }
                b'\\' => {
                    self.pos += 1;
                    match *self.src.get(self.pos)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.pos += 1,
                        b'u' => {
                            let hex = self.src.get(self.pos + 1..self.pos + 5)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return None;
                            }
                            self.pos += 5;
                        }
                        _ => return None,
                    }
                }
                _ => return None,
            }
        }
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    fn number(&mut self) -> Option<()> {
        if self.src.get(self.pos) == Some(&b'-') {
            self.pos += 1;
        }
        match *self.src.get(self.pos)? {
            b'0' => self.pos += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.src.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            self.require_digits()?;
        }
        if let Some(b'e' | b'E') = self.src.get(self.pos) {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.src.get(self.pos) {
                self.pos += 1;
            }
            self.require_digits()?;
        }
        Some(())
    }

    fn digits(&mut self) {
        while self.src.get(self.pos).is_some_and(u8::is_ascii_digit) {
            self.pos += 1;
        }
    }

    fn require_digits(&mut self) -> Option<()> {
        let start = self.pos;
        self.digits();
        (self.pos > start).then_some(())
    }
}

/// An object key's text between the quotes (valid JSON string content), with its
/// escapes decoded into the UTF-8 bytes of the characters they stand for. A lone
/// surrogate (`"\ud800"`) is not a character; it decodes to the three bytes UTF-8 would
/// give its code point, which no valid character's encoding shares.
fn decoded_key(raw: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if !raw.contains(&b'\\') {
        return std::borrow::Cow::Borrowed(raw);
    }
    let hex4 = |at: usize| -> u32 {
        raw.get(at..at + 4)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .unwrap_or(0)
    };
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] != b'\\' {
            out.push(raw[i]);
            i += 1;
            continue;
        }
        let (code, used) = match raw[i + 1] {
            b'b' => (0x08, 2),
            b'f' => (0x0C, 2),
            b'n' => (0x0A, 2),
            b'r' => (0x0D, 2),
            b't' => (0x09, 2),
            b'u' => {
                let high = hex4(i + 2);
                let low_follows = raw.get(i + 6..i + 8) == Some(b"\\u".as_slice());
                let low = if low_follows { hex4(i + 8) } else { 0 };
                if (0xD800..0xDC00).contains(&high) && (0xDC00..0xE000).contains(&low) {
                    (0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00), 12)
                } else {
                    (high, 6)
                }
            }
            other => (u32::from(other), 2), // `\"`, `\\`, `\/`
        };
        push_code_point(&mut out, code);
        i += used;
    }
    std::borrow::Cow::Owned(out)
}

/// Appends the UTF-8 form of `code` (a lone surrogate included, see [`decoded_key`]).
fn push_code_point(out: &mut Vec<u8>, code: u32) {
    // Truncating casts are intended: each keeps the bits of one UTF-8 byte.
    #[allow(clippy::cast_possible_truncation)]
    match code {
        0..=0x7F => out.push(code as u8),
        0x80..=0x7FF => out.extend([0xC0 | (code >> 6) as u8, 0x80 | (code & 0x3F) as u8]),
        0x800..=0xFFFF => out.extend([
            0xE0 | (code >> 12) as u8,
            0x80 | ((code >> 6) & 0x3F) as u8,
            0x80 | (code & 0x3F) as u8,
        ]),
        _ => out.extend([
            0xF0 | (code >> 18) as u8,
            0x80 | ((code >> 12) & 0x3F) as u8,
            0x80 | ((code >> 6) & 0x3F) as u8,
            0x80 | (code & 0x3F) as u8,
        ]),
    }
}

/// Writes the canonical form of the tree; iterative, like the parser.
fn emit(src: &[u8], mut arena: Vec<Node>, root: usize) -> Vec<u8> {
    enum Step {
        Value(usize),
        Raw(&'static [u8]),
        Key(usize, usize),
    }
    let mut out = Vec::with_capacity(src.len());
    let mut todo = vec![Step::Value(root)];
    while let Some(step) = todo.pop() {
        match step {
            Step::Raw(bytes) => out.extend_from_slice(bytes),
            Step::Key(start, end) => {
                out.push(b'"');
                out.extend_from_slice(&src[start..end]);
                out.extend_from_slice(b"\":");
            }
            Step::Value(index) => match &mut arena[index] {
                Node::Scalar(start, end) => out.extend_from_slice(&src[*start..*end]),
                Node::Array(items) => {
                    out.push(b'[');
                    todo.push(Step::Raw(b"]"));
                    for (i, &item) in items.iter().enumerate().rev() {
                        todo.push(Step::Value(item));
                        if i > 0 {
                            todo.push(Step::Raw(b","));
                        }
                    }
                }
                Node::Object(members) => {
                    // By the decoded key, stably: members whose keys decode alike (`"a"`
                    // and `"\u0061"`, or true duplicates) keep their document order, which
                    // decides what a parser that keeps the last one sees.
                    members.sort_by_cached_key(|member| decoded_key(&src[member.0..member.1]));
                    out.push(b'{');
                    todo.push(Step::Raw(b"}"));
                    for (i, &(start, end, value)) in members.iter().enumerate().rev() {
                        todo.push(Step::Value(value));
                        todo.push(Step::Key(start, end));
                        if i > 0 {
                            todo.push(Step::Raw(b","));
                        }
                    }
                }
            },
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;
    use proptest::prelude::*;

    fn request(mode: FingerprintMode, method: Method, uri: &str, body: &str) -> RequestFingerprint {
        RequestFingerprint::new(
            mode,
            method,
            uri.parse().unwrap(),
            bytes::Bytes::copy_from_slice(body.as_bytes()),
        )
    }

    #[test]
    fn a_request_frames_alike_exactly_when_every_part_is_equal() {
        use FingerprintMode::{Json, Raw};
        let original = request(Raw, Method::POST, "/p/a?x=1", "{}");
        let framed = original.framed(usize::MAX).unwrap();
        assert!(original.is_framed(&framed));
        assert!(request(Raw, Method::POST, "/p/a?x=1", "{}").is_framed(&framed));
        let others = [
            request(Json, Method::POST, "/p/a?x=1", "{}"),
            request(Raw, Method::PUT, "/p/a?x=1", "{}"),
            request(Raw, Method::POST, "/p/b?x=1", "{}"),
            request(Raw, Method::POST, "/p/a?x=2", "{}"),
            request(Raw, Method::POST, "/p/a?", "{}"),
            request(Raw, Method::POST, "/p/a", "{}"),
            request(Raw, Method::POST, "/p/a?x=1", "{ }"),
            request(Raw, Method::POST, "/p/a?x=1", ""),
            // Bytes moved between the parts.
            request(Raw, Method::POST, "/p/a?x=1{", "}"),
            request(Raw, Method::POST, "/p/a?x", "=1{}"),
        ];
        for other in &others {
            assert!(!other.is_framed(&framed), "{other:?}");
            assert!(
                !original.is_framed(&other.framed(usize::MAX).unwrap()),
                "{other:?}"
            );
        }
        // No query and an empty one frame apart.
        let no_query = request(Raw, Method::POST, "/p", "");
        assert!(
            !request(Raw, Method::POST, "/p?", "").is_framed(&no_query.framed(usize::MAX).unwrap())
        );
        // A prefix or an extension of the framing is not it.
        assert!(!original.is_framed(&framed[..framed.len() - 1]));
        let mut longer = framed.to_vec();
        longer.push(0);
        assert!(!original.is_framed(&longer));
        // Comparing hashes nothing.
        assert!(!original.is_computed());
    }

    #[test]
    fn a_request_fingerprint_is_the_computed_fingerprint() {
        for mode in [FingerprintMode::Raw, FingerprintMode::Json] {
            let lazy = request(mode, Method::POST, "/p?q", r#"{"b": 1, "a": 2}"#);
            let eager =
                Fingerprint::compute(mode, &Method::POST, "/p", Some("q"), br#"{"b": 1, "a": 2}"#);
            assert_eq!(lazy.get(), eager);
            assert!(lazy.is_computed());
        }
    }

    #[test]
    fn only_requests_within_the_bound_are_copied_and_a_bare_fingerprint_never_frames() {
        let lazy = request(FingerprintMode::Raw, Method::POST, "/p", "body");
        let len = lazy.framed(usize::MAX).unwrap().len();
        assert!(lazy.framed(len).is_some());
        assert!(lazy.framed(len - 1).is_none());
        let bare = RequestFingerprint::from(lazy.get());
        assert!(bare.framed(usize::MAX).is_none());
        assert!(!bare.is_framed(&lazy.framed(len).unwrap()));
        assert_eq!(bare.get(), lazy.get());
    }

    fn fp(
        mode: FingerprintMode,
        method: Method,
        path: &str,
        query: Option<&str>,
        body: &[u8],
    ) -> Fingerprint {
        Fingerprint::compute(mode, &method, path, query, body)
    }

    fn raw(path: &str, query: Option<&str>, body: &[u8]) -> Fingerprint {
        fp(FingerprintMode::Raw, Method::POST, path, query, body)
    }

    fn json(body: &str) -> Fingerprint {
        fp(
            FingerprintMode::Json,
            Method::POST,
            "/p",
            None,
            body.as_bytes(),
        )
    }

    fn canon(body: &str) -> Option<String> {
        canonical_json(body.as_bytes()).map(|c| String::from_utf8(c).unwrap())
    }

    fn hex(digest: &[u8]) -> String {
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn versions() {
        assert_eq!(raw("/p", None, b"").version, 1);
        assert_eq!(json("{}").version, 2);
        assert_eq!(json("not json").version, 2);
    }

    #[test]
    fn framing_is_unambiguous() {
        assert_ne!(raw("/a", Some("b=c"), b""), raw("/ab", Some("=c"), b""));
        assert_ne!(raw("/p", None, b""), raw("/p", Some(""), b""));
        assert_ne!(raw("/p", Some("a"), b"b"), raw("/p", Some("ab"), b""));
        assert_ne!(raw("/p", Some("a"), b"b"), raw("/p", Some(""), b"ab"));
        assert_ne!(raw("/p", None, b"x"), raw("/px", None, b""));
        assert_ne!(raw("/p", None, b"\0"), raw("/p", Some(""), b""));
        for mode in [FingerprintMode::Raw, FingerprintMode::Json] {
            let post = fp(mode, Method::POST, "/p", None, b"{}");
            assert_ne!(post, fp(mode, Method::PUT, "/p", None, b"{}"));
            assert_ne!(
                post,
                fp(
                    mode,
                    Method::from_bytes(b"post").unwrap(),
                    "/p",
                    None,
                    b"{}"
                )
            );
            assert_ne!(
                fp(mode, Method::POST, "X/p", None, b"{}"),
                fp(
                    mode,
                    Method::from_bytes(b"POSTX").unwrap(),
                    "/p",
                    None,
                    b"{}"
                )
            );
            assert_ne!(post, fp(mode, Method::POST, "/p/", None, b"{}"));
        }
    }

    #[test]
    fn raw_mode_is_sensitive_to_every_byte() {
        let body = br#"{"amount":100,"currency":"EUR"}"#;
        let base = raw("/p", None, body);
        assert_eq!(base, raw("/p", None, body));
        for i in 0..body.len() {
            let mut changed = body.to_vec();
            changed[i] ^= 1;
            assert_ne!(base, raw("/p", None, &changed), "byte {i}");
        }
        assert_ne!(base, raw("/p", None, br#"{"currency":"EUR","amount":100}"#));
        assert_ne!(
            base,
            raw("/p", None, br#"{"amount":100,"currency":"EUR"} "#)
        );
        assert_ne!(
            raw("/p", Some("a=1&b=2"), b""),
            raw("/p", Some("b=2&a=1"), b"")
        );
    }

    #[test]
    fn json_mode_ignores_key_order_and_whitespace() {
        let a = json(r#"{"amount":100,"currency":"EUR","meta":{"x":[1,{"b":2,"a":1}],"y":null}}"#);
        let b = json(
            " {\n\t\"meta\" : { \"y\" : null , \"x\" : [ 1 , { \"a\" : 1 , \"b\" : 2 } ] } ,\r\n  \"currency\":\"EUR\",\"amount\" : 100 }\n",
        );
        assert_eq!(a, b);
        assert_eq!(json("[]"), json(" [ ] "));
        assert_eq!(json("{}"), json("{ \n}"));
        assert_eq!(json("\"s\""), json(" \"s\"\t"));
    }

    #[test]
    fn json_mode_keeps_values_as_written() {
        let pairs = [
            (r#"{"n":1}"#, r#"{"n":1.0}"#),
            (r#"{"n":100}"#, r#"{"n":1e2}"#),
            (r#"{"n":1e2}"#, r#"{"n":1E2}"#),
            (r#"{"n":1e2}"#, r#"{"n":1e+2}"#),
            (r#"{"n":0}"#, r#"{"n":-0}"#),
            (r#"{"s":"A"}"#, r#"{"s":"\u0041"}"#),
            (r#"{"s":"/"}"#, r#"{"s":"\/"}"#),
            (r#"{"s":"\u00e9"}"#, r#"{"s":"\u00E9"}"#),
            (r#"{"s":"a b"}"#, r#"{"s":"a  b"}"#),
            (r#"{"A":1}"#, r#"{"\u0041":1}"#),
            ("[1,2]", "[2,1]"),
            (r#"{"a":[1,2]}"#, r#"{"a":[2,1]}"#),
            (r#"{"a":1}"#, r#"{"a":2}"#),
            (r#"{"a":1}"#, r#"{"b":1}"#),
            (r#"{"a":true}"#, r#"{"a":"true"}"#),
            (r#"{"a":null}"#, r#"{}"#),
            (r#"{"a":1,"a":2}"#, r#"{"a":2,"a":1}"#),
            (r#"{"a":1,"a":1}"#, r#"{"a":1}"#),
            ("[[]]", "[]"),
            ("{}", "[]"),
        ];
        for (x, y) in pairs {
            assert_ne!(json(x), json(y), "{x} vs {y}");
        }
    }

    #[test]
    fn canonical_form() {
        assert_eq!(
            canon(r#" { "b" : [ 1 , 2.50 ] , "a" : { "d" : "\u0041" , "c" : -1E-2 } } "#).unwrap(),
            r#"{"a":{"c":-1E-2,"d":"\u0041"},"b":[1,2.50]}"#
        );
        // Duplicates are kept, in document order, after a stable sort.
        assert_eq!(
            canon(r#"{"b":0,"a":2,"b":1,"a":1}"#).unwrap(),
            r#"{"a":2,"a":1,"b":0,"b":1}"#
        );
        // Sorted by the decoded key (`\u0041` is `A`), a prefix first; written as sent.
        assert_eq!(
            canon(r#"{"a!":1,"a":2,"\u0041":3,"B":4}"#).unwrap(),
            r#"{"\u0041":3,"B":4,"a":2,"a!":1}"#
        );
        // Keys that decode alike keep their order: the two documents decode differently
        // (the last `a` wins), so their fingerprints must differ.
        assert_ne!(
            canon(r#"{"a":1,"\u0061":2}"#).unwrap(),
            canon(r#"{"\u0061":2,"a":1}"#).unwrap()
        );
        assert_ne!(
            json(r#"{"a":1,"\u0061":2}"#).digest,
            json(r#"{"\u0061":2,"a":1}"#).digest
        );
        // Surrogate pairs decode to their character: U+1F600 sorts after U+FFFF.
        assert_eq!(
            canon(r#"{"\ud83d\ude00":1,"\uffff":2,"\n":3}"#).unwrap(),
            r#"{"\n":3,"\uffff":2,"\ud83d\ude00":1}"#
        );
        assert_eq!(canon("true").unwrap(), "true");
        // Valid JSON beyond f64 (serde_json refuses it); kept as written.
        assert_eq!(canon("[1e400,-1e400]").unwrap(), "[1e400,-1e400]");
        agrees_with_serde(b"1e400").unwrap();
        assert_eq!(canon("[{},[],\"\",0]").unwrap(), "[{},[],\"\",0]");
        assert_eq!(canon("\"ünï\"").unwrap(), "\"ünï\"");
    }

    #[test]
    fn canonical_form_is_idempotent() {
        let doc = r#"{"z":[{"y":1,"x":[true,false,null]}],"a":{"c":"d","b":-0.5e10}}"#;
        let once = canon(doc).unwrap();
        assert_eq!(canon(&once).unwrap(), once);
    }

    #[test]
    fn invalid_json_is_refused_by_the_canonicaliser() {
        for body in [
            "",
            " ",
            "{",
            "}",
            "[1,]",
            "[,1]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{a:1}",
            "{\"a\"}",
            "[1 2]",
            "01",
            "1.",
            ".5",
            "1e",
            "+1",
            "-",
            "--1",
            "0x1",
            "NaN",
            "tru",
            "nulls",
            "\"a",
            "\"\\x\"",
            "\"\\u12G4\"",
            "\"\\u12\"",
            "\"tab\there\"",
            "1 2",
            "{} {}",
            "[]]",
            "'a'",
            "\u{feff}{}",
            "[1}",
            "{\"a\":1]",
            "{,}",
            "{\"a\":}",
        ] {
            assert_eq!(canon(body), None, "{body:?}");
        }
        assert_eq!(canonical_json(b"\"\xff\""), None);
    }

    #[test]
    fn invalid_json_falls_back_to_raw_bytes_distinct_from_canonical() {
        assert_eq!(json("{a:1}"), json("{a:1}"));
        assert_ne!(json("{a:1}"), json("{a: 1}"));
        // The invalid body `{"a":1` must not equal a valid body whose canonical text is
        // the same bytes, and an empty body differs from every JSON text.
        assert_ne!(json(r#"{"a":1"#), json(r#"{"a":1}"#));
        assert_ne!(json(""), json("\"\""));
        // Canonical text of valid input vs the same text treated as invalid: only the
        // marker byte differs, and it does.
        let mut canonical = Sha256::new();
        field(&mut canonical, FingerprintMode::Json.tag());
        field(&mut canonical, b"POST");
        field(&mut canonical, b"/p");
        canonical.update([0]);
        canonical.update([1]);
        field(&mut canonical, b"{}");
        let digest: [u8; 32] = canonical.finalize().into();
        assert_eq!(json("{ }").digest, digest);
    }

    #[test]
    fn raw_and_json_modes_differ() {
        for body in [&b""[..], b"{}", b"{\"a\":1}", b"not json"] {
            assert_ne!(
                fp(FingerprintMode::Raw, Method::POST, "/p", None, body).digest,
                fp(FingerprintMode::Json, Method::POST, "/p", None, body).digest
            );
        }
    }

    #[test]
    fn deep_nesting_does_not_overflow() {
        let depth = 200_000;
        let doc = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert_eq!(canon(&doc).unwrap(), doc);
        let doc = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
        assert_eq!(canon(&doc).unwrap(), doc);
        assert_eq!(canon(&"[".repeat(depth)), None);
    }

    /// Known answers, computed once (and cross-checked against an independent Python
    /// implementation of the framing in the module docs). If one of these changes, the
    /// framing changed: stored fingerprints no longer match and the version must be bumped.
    #[test]
    fn known_answers() {
        let body = br#"{ "currency": "EUR", "amount": 1000 }"#;
        let raw = Fingerprint::compute(
            FingerprintMode::Raw,
            &Method::POST,
            "/payments",
            Some("dry_run=1"),
            body,
        );
        let json = Fingerprint::compute(
            FingerprintMode::Json,
            &Method::POST,
            "/payments",
            Some("dry_run=1"),
            body,
        );
        let empty = Fingerprint::compute(FingerprintMode::Raw, &Method::GET, "/", None, b"");
        let invalid = Fingerprint::compute(
            FingerprintMode::Json,
            &Method::PUT,
            "/x",
            Some(""),
            b"{oops",
        );
        assert_eq!(
            hex(&raw.digest),
            "3779a9593eaee9baafa5cc137733208f57891e1830fcb40cf013205d1b04f281"
        );
        assert_eq!(
            hex(&json.digest),
            "ab5e68f42382eaf63ced999d965c6d458e345fc8305dcc14bc416f4b436b6dcd"
        );
        assert_eq!(
            hex(&empty.digest),
            "48b4aaf981cdac9a5ae19ff705b00c87b927b77d34931fb0122e13d6e9a25e64"
        );
        assert_eq!(
            hex(&invalid.digest),
            "916de2d30156935e1f8ea2365d0d7f76526e6185c51456ca5da8125438631066"
        );
    }

    fn json_value() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            "-?(0|[1-9][0-9]{0,3})(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,2})?",
            r#""([a-c ]|\\u00[4-6][0-9a-f]|\\[nt"])*""#,
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                proptest::collection::vec(("[a-d]{0,2}", inner), 0..6).prop_map(|members| {
                    let members: Vec<String> = members
                        .into_iter()
                        .map(|(k, v)| format!("\"{k}\":{v}"))
                        .collect();
                    format!("{{{}}}", members.join(","))
                }),
            ]
        })
    }

    /// Our notion of "valid JSON" is serde_json's, except that serde_json refuses numbers
    /// outside f64's range, which are valid JSON and kept as written here.
    fn agrees_with_serde(bytes: &[u8]) -> Result<(), TestCaseError> {
        let ours = canonical_json(bytes).is_some();
        let serde = serde_json::from_slice::<serde_json::Value>(bytes);
        let out_of_range =
            matches!(&serde, Err(e) if e.to_string().starts_with("number out of range"));
        prop_assert!(
            ours == serde.is_ok() || (ours && out_of_range),
            "{:?}: ours {ours}, serde {serde:?}",
            String::from_utf8_lossy(bytes)
        );
        Ok(())
    }

    proptest! {
        #[test]
        fn generated_json_matches_serde(doc in json_value()) {
            // Our parser accepts what serde_json accepts...
            let parsed: serde_json::Value = serde_json::from_str(&doc).unwrap();
            let canonical = canon(&doc);
            prop_assert!(canonical.is_some());
            let canonical = canonical.unwrap();
            // ...the canonical form means the same (duplicate keys keep their order, so
            // the last one still wins)...
            prop_assert_eq!(serde_json::from_str::<serde_json::Value>(&canonical).unwrap(), parsed);
            // ...and is a fixed point.
            prop_assert_eq!(canon(&canonical), Some(canonical.clone()));
        }

        #[test]
        fn whitespace_never_matters_in_json_mode(doc in json_value(), ws in "[ \t\r\n]{0,3}") {
            // Whitespace after every structural character.
            let spaced: String = doc.chars().map(|c| {
                let mut s = c.to_string();
                if matches!(c, '{' | '}' | '[' | ']' | ':' | ',') { s.push_str(&ws); }
                s
            }).collect();
            // The string leaves above contain none of those characters, so this spacing
            // only touches structure.
            prop_assert_eq!(json(&doc), json(&format!("{ws}{spaced}")));
        }

        #[test]
        fn member_order_never_matters_in_json_mode(
            members in proptest::collection::btree_map("[a-z]{0,3}", json_value(), 0..8),
        ) {
            let object = |members: Vec<(&String, &String)>| {
                let members: Vec<String> = members.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                format!("{{{}}}", members.join(","))
            };
            let forward = object(members.iter().collect());
            let backward = object(members.iter().rev().collect());
            prop_assert_eq!(json(&forward), json(&backward));
            prop_assert_eq!(json(&format!("[{forward}]")), json(&format!("[{backward}]")));
        }

        #[test]
        fn validity_agrees_with_serde(bytes in proptest::collection::vec(proptest::sample::select(b"{}[]:,\"\\ 0123456789.eE+-tfrnul".to_vec()), 0..24)) {
            agrees_with_serde(&bytes)?;
        }

        #[test]
        fn validity_of_mutated_documents_agrees_with_serde(
            doc in json_value(),
            at in any::<proptest::sample::Index>(),
            byte in proptest::sample::select(b"{}[]:,\"\\ 0.eE+-tu\x01".to_vec()),
            how in 0..3u8,
        ) {
            let mut bytes = doc.into_bytes();
            let at = at.index(bytes.len() + 1);
            match how {
                0 => bytes.insert(at, byte),
                1 if at < bytes.len() => { bytes.remove(at); }
                _ if at < bytes.len() => bytes[at] = byte,
                _ => bytes.push(byte),
            }
            agrees_with_serde(&bytes)?;
        }

        #[test]
        fn arbitrary_bodies_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Fingerprint::compute(FingerprintMode::Json, &Method::POST, "/p", None, &bytes);
        }
    }
}
