//! The Axum glue the `#[idempotent]` expansion uses: [`Guard`] (after the scope argument),
//! [`Hashed`] (wraps the last extractor), [`IdempotencyKey`] (optional handler argument)
//! and the [`Scope`] trait.

use std::borrow::Cow;

use axum::body::{Body, Bytes};
use axum::extract::{FromRef, FromRequest, FromRequestParts, Request};
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::{Method, StatusCode};
use sha2::{Digest, Sha256};

use crate::config::HandlerConfig;
use crate::engine::Idempotency;
use crate::fingerprint::{Fingerprint, FingerprintMode};
use crate::key::{self, KeyError};
use crate::problem::{Problem, codes};

/// The authenticated caller an idempotency key belongs to. Keys are unique per scope,
/// so two callers may both send `order-1042`.
///
/// Implement it for the type your authentication extractor yields. The scope must come
/// from authentication, never from a header the client controls.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the idempotency scope: it does not implement `Scope`",
    label = "`scope` names an argument of this type",
    note = "implement `idempotent_runtime::Scope` for the authenticated caller's type (e.g. return its account id), or point `scope` at the argument that identifies the caller"
)]
pub trait Scope {
    /// A stable identifier of the caller, e.g. an account id.
    fn scope(&self) -> Cow<'_, str>;
}

impl Scope for String {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl Scope for str {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl<T: Scope + ?Sized> Scope for &T {
    fn scope(&self) -> Cow<'_, str> {
        (**self).scope()
    }
}

macro_rules! scope_for_integers {
    ($($ty:ty),*) => {$(
        impl Scope for $ty {
            fn scope(&self) -> Cow<'_, str> {
                Cow::Owned(self.to_string())
            }
        }
    )*};
}
scope_for_integers!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize
);

/// The argument the expansion adds right after the scope argument: the parsed
/// `Idempotency-Key` and the engine, found in the router state through `FromRef`.
///
/// Rejects with `400` problem+json when the key is missing or invalid — after
/// authentication (an unauthenticated caller gets its `401` first), before the body is
/// read and before the store is touched.
#[derive(Debug, Clone)]
pub struct Guard {
    engine: Idempotency,
    key: String,
}

impl<S> FromRequestParts<S> for Guard
where
    Idempotency: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let engine = Idempotency::from_ref(state);
        let key = key::parse_header(&parts.headers, engine.header_name())
            .map_err(|err| key_problem(&err).into_response())?;
        Ok(Self { engine, key })
    }
}

impl Guard {
    /// The claimed key as the client sent it (unquoted).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The engine.
    pub fn engine(&self) -> &Idempotency {
        &self.engine
    }

    /// Runs the handler through the engine; see [`Idempotency::run`].
    pub async fn run<F, Fut, R>(
        self,
        config: &HandlerConfig,
        scope: &str,
        fingerprint: Fingerprint,
        handler: F,
    ) -> Response
    where
        F: FnOnce(IdempotencyKey) -> Fut + Send + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: IntoResponse + 'static,
    {
        self.engine
            .run(config, scope, &self.key, fingerprint, handler)
            .await
    }
}

impl Guard {
    /// Runs a transactional handler through the engine; see
    /// [`Idempotency::run_in_transaction`].
    #[cfg(feature = "sql")]
    pub async fn run_in_transaction<DB, F, Fut, T, E>(
        self,
        config: &HandlerConfig,
        scope: &str,
        fingerprint: Fingerprint,
        handler: F,
    ) -> Response
    where
        DB: crate::transaction::TxDatabase,
        F: FnOnce(IdempotencyKey, crate::transaction::Tx<DB>) -> Fut + Send + 'static,
        Fut: Future<Output = (Result<T, E>, crate::transaction::Tx<DB>)> + Send + 'static,
        T: IntoResponse + 'static,
        E: IntoResponse + 'static,
    {
        self.engine
            .run_in_transaction(config, scope, &self.key, fingerprint, handler)
            .await
    }
}

/// The `400` problem for a refused key.
pub fn key_problem(err: &KeyError) -> Problem {
    let (code, reason) = match err {
        KeyError::Missing => (codes::KEY_MISSING, "missing"),
        KeyError::Blank => (codes::KEY_INVALID, "blank"),
        KeyError::TooLong { .. } => (codes::KEY_INVALID, "too_long"),
        KeyError::InvalidCharacter => (codes::KEY_INVALID, "invalid_character"),
        KeyError::MalformedQuoting(_) => (codes::KEY_INVALID, "malformed_quoting"),
        KeyError::Multiple => (codes::KEY_INVALID, "multiple_fields"),
    };
    let title = if matches!(err, KeyError::Missing) {
        "Idempotency key missing"
    } else {
        "Idempotency key invalid"
    };
    Problem::new(
        StatusCode::BAD_REQUEST,
        code,
        title,
        format!(
            "{err}. Send one Idempotency-Key header with 1 to 255 printable ASCII characters, \
             e.g. a UUID, and reuse it on every retry of the same operation."
        ),
    )
    .with_reason(reason)
}

/// Wraps a handler's last extractor `T`: reads the raw body (within the route's
/// `DefaultBodyLimit`), keeps it for the fingerprint, then runs `T` on a rebuilt request.
/// Use `Hashed<()>` for handlers without a body extractor.
#[derive(Debug)]
pub struct Hashed<T> {
    value: T,
    method: Method,
    path: String,
    query: Option<String>,
    body: Bytes,
}

/// The marker type `Hashed<T>` extracts through: `T`'s own marker wrapped, so `Hashed`
/// works whether `T` reads the body or only the request head.
#[doc(hidden)]
#[derive(Debug)]
pub struct ViaHashed<M>(std::marker::PhantomData<M>);

impl<S, T, M> FromRequest<S, ViaHashed<M>> for Hashed<T>
where
    S: Send + Sync,
    T: FromRequest<S, M>,
{
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let (parts, body) = req.into_parts();
        // `Bytes` honours `DefaultBodyLimit` and answers `413` over it.
        let raw = Bytes::from_request(Request::from_parts(parts.clone(), body), state)
            .await
            .map_err(IntoResponse::into_response)?;
        let method = parts.method.clone();
        // Behind `Router::nest` the URI has lost its prefix (and the prefix's path
        // parameters): fingerprint the URI the client sent.
        let uri = parts
            .extensions
            .get::<axum::extract::OriginalUri>()
            .map_or(&parts.uri, |original| &original.0);
        let path = uri.path().to_owned();
        let query = uri.query().map(str::to_owned);
        let rebuilt = Request::from_parts(parts, Body::from(raw.clone()));
        let value = T::from_request(rebuilt, state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Self {
            value,
            method,
            path,
            query,
            body: raw,
        })
    }
}

impl<T> Hashed<T> {
    /// The inner extractor's value and the request's fingerprint.
    pub fn into_parts(self, mode: FingerprintMode) -> (T, Fingerprint) {
        let fingerprint = Fingerprint::compute(
            mode,
            &self.method,
            &self.path,
            self.query.as_deref(),
            &self.body,
        );
        (self.value, fingerprint)
    }
}

/// The claimed key, handed to the handler body when it asks for it (an argument of type
/// `IdempotencyKey`). Use [`derive`](Self::derive) for keys sent to downstream providers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey {
    scope: String,
    key: String,
    fingerprint: Option<Fingerprint>,
}

impl IdempotencyKey {
    /// The key for `key` in `scope`.
    pub fn new(scope: String, key: String) -> Self {
        Self {
            scope,
            key,
            fingerprint: None,
        }
    }

    /// The key as claimed for a request with `fingerprint` (what the engine hands a
    /// handler): [`derive`](Self::derive) then also depends on the request.
    pub fn for_request(scope: String, key: String, fingerprint: Fingerprint) -> Self {
        Self {
            scope,
            key,
            fingerprint: Some(fingerprint),
        }
    }

    /// The key as the client sent it.
    pub fn as_str(&self) -> &str {
        &self.key
    }

    /// The caller's scope.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// A deterministic key for a downstream call, unique per (scope, key, purpose) and,
    /// for the key the engine hands a handler, per request fingerprint: `idem_` followed
    /// by 64 hex digits (69 characters, within every provider's limit).
    ///
    /// A retry after a crash is the same request under the same key, so it sends the same
    /// derived key and the provider deduplicates too. A key reused after its TTL for a
    /// *different* request derives a different downstream key, so the provider sees a new
    /// operation instead of answering with the old one.
    ///
    /// ```
    /// use idempotent_runtime::IdempotencyKey;
    /// let key = IdempotencyKey::new("acct_alice".into(), "order-1042".into());
    /// assert_eq!(key.derive("charge"), key.derive("charge"));
    /// assert_ne!(key.derive("charge"), key.derive("refund"));
    /// assert_eq!(key.derive("charge").len(), 69);
    ///
    /// use idempotent_runtime::Fingerprint;
    /// let request = |n| Fingerprint { version: 1, digest: [n; 32] };
    /// let claimed = |n| IdempotencyKey::for_request("acct_alice".into(), "order-1042".into(), request(n));
    /// assert_eq!(claimed(1).derive("charge"), claimed(1).derive("charge"));
    /// assert_ne!(claimed(1).derive("charge"), claimed(2).derive("charge"));
    /// ```
    pub fn derive(&self, purpose: &str) -> String {
        let mut hasher = Sha256::new();
        for part in [
            self.scope.as_bytes(),
            self.key.as_bytes(),
            purpose.as_bytes(),
        ] {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        if let Some(fingerprint) = &self.fingerprint {
            hasher.update(fingerprint.version.to_be_bytes());
            hasher.update(fingerprint.digest);
        }
        let digest = hasher.finalize();
        let mut out = String::with_capacity(69);
        out.push_str("idem_");
        for byte in digest.iter() {
            out.push_str(&format!("{byte:02x}"));
        }
        out
    }
}

impl std::fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.key)
    }
}
