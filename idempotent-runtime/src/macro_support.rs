//! Macro support: the Axum extractors an `#[idempotent]` expansion adds to a handler.
//!
//! Not for direct use: [`Guard`] (added right after the scope argument) and [`Hashed`]
//! (wrapping the handler's last extractor) are what the attribute macro generates, and
//! they change with it. Write `#[idempotent(...)]` instead, or call
//! [`Idempotency::run`] from your own code.

use axum::body::{Body, Bytes};
use axum::extract::{FromRef, FromRequest, FromRequestParts, Request};
use axum::response::{IntoResponse, Response};
use http::Method;
use http::request::Parts;

use crate::config::HandlerConfig;
use crate::engine::Idempotency;
use crate::fingerprint::{Fingerprint, FingerprintMode};
use crate::key::{self, IdempotencyKey};
use crate::problem::key_problem;

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
        // `Bytes` honours `DefaultBodyLimit` and answers `413` over it — as problem+json,
        // like every other answer the library gives itself.
        let raw = match Bytes::from_request(Request::from_parts(parts.clone(), body), state).await {
            Ok(raw) => raw,
            Err(rejection) => {
                return Err(crate::rejection::problem_from(rejection.into_response()).await);
            }
        };
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
