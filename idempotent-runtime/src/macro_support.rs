//! Macro support: the Axum extractors an `#[idempotent]` expansion adds to a handler.
//!
//! Not for direct use: [`Guard`] (added right after the scope argument) and [`Hashed`]
//! (wrapping the handler's last extractor) are what the attribute macro generates, and
//! they change with it. Write `#[idempotent(...)]` instead, or call
//! [`Idempotency::run`] from your own code.

use axum::RequestExt;
use axum::body::{Body, Bytes};
use axum::extract::{FromRef, FromRequest, FromRequestParts, MatchedPath, Request};
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use http::Method;
use http::request::Parts;
use http_body_util::BodyExt;

use crate::config::HandlerConfig;
use crate::engine::Idempotency;
use crate::fingerprint::{FingerprintMode, RequestFingerprint};
use crate::key::{self, IdempotencyKey, KeyError};
use crate::metrics::{self, Outcome, UNNAMED};
use crate::problem::key_problem;

/// The argument the expansion adds right after the scope argument: the parsed
/// `Idempotency-Key` and the engine, found in the router state through `FromRef`.
///
/// Rejects with `400` problem+json when the key is missing or invalid — after
/// authentication (an unauthenticated caller gets its `401` first), before the body is
/// read and before the store is touched. `Guard<true>` (`key = optional`) lets a request
/// without the header through, unprotected; a malformed key is still `400`.
#[derive(Debug, Clone)]
pub struct Guard<const KEY_OPTIONAL: bool = false> {
    engine: Idempotency,
    /// `None` only for `Guard<true>`, when the request carries no key.
    key: Option<String>,
}

impl<S, const KEY_OPTIONAL: bool> FromRequestParts<S> for Guard<KEY_OPTIONAL>
where
    Idempotency: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let engine = Idempotency::from_ref(state);
        let key = match key::parse_header(&parts.headers, engine.header_name()) {
            Ok(key) => Some(key),
            Err(KeyError::Missing) if KEY_OPTIONAL => None,
            Err(err) => {
                // The handler's name is out of reach in an extractor: count by route.
                let route = parts.extensions.get::<MatchedPath>();
                let label = route.map_or(UNNAMED.to_owned(), |path| path.as_str().to_owned());
                metrics::count_labelled(label, Outcome::of_key_error(&err));
                return Err(key_problem(&err).into_response());
            }
        };
        Ok(Self { engine, key })
    }
}

impl Guard {
    /// The key a required guard was extracted with.
    fn required_key(&self) -> &str {
        self.key
            .as_deref()
            .expect("`Guard<false>` refuses a request without a key at extraction")
    }

    /// Runs the handler through the engine; see [`Idempotency::run`].
    pub async fn run<F, Fut, R>(
        self,
        config: &HandlerConfig,
        scope: &str,
        fingerprint: RequestFingerprint,
        handler: F,
    ) -> Response
    where
        F: FnOnce(IdempotencyKey) -> Fut + Send + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: IntoResponse + 'static,
    {
        self.engine
            .run(config, scope, self.required_key(), fingerprint, handler)
            .await
    }

    /// Runs a transactional handler through the engine; see
    /// [`Idempotency::run_in_transaction`].
    #[cfg(feature = "sql")]
    pub async fn run_in_transaction<DB, F, Fut, T, E>(
        self,
        config: &HandlerConfig,
        scope: &str,
        fingerprint: RequestFingerprint,
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
            .run_in_transaction(config, scope, self.required_key(), fingerprint, handler)
            .await
    }
}

impl Guard<true> {
    /// `key = optional`: with a key, runs the handler through the engine (see
    /// [`Idempotency::run`]) and hands it `Some(key)`; without one, runs it unprotected
    /// with `None` — nothing is claimed, stored or replayed.
    pub async fn run<F, Fut, R>(
        self,
        config: &HandlerConfig,
        scope: &str,
        fingerprint: RequestFingerprint,
        handler: F,
    ) -> Response
    where
        F: FnOnce(Option<IdempotencyKey>) -> Fut + Send + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: IntoResponse + 'static,
    {
        match &self.key {
            Some(key) => {
                self.engine
                    .run(config, scope, key, fingerprint, |key| handler(Some(key)))
                    .await
            }
            None => self.engine.run_unprotected(config, handler(None)).await,
        }
    }
}

/// Wraps a handler's last extractor `T`: reads the raw body (within the route's
/// `DefaultBodyLimit`), keeps it for the fingerprint, then runs `T` on a rebuilt request.
/// Use `Hashed<()>` for handlers without a body extractor.
#[derive(Debug)]
pub struct Hashed<T> {
    value: T,
    method: Method,
    uri: http::Uri,
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
        let (parts, raw) = buffer_body(parts, body).await?;
        let method = parts.method.clone();
        // A clone shares the URI's bytes: nothing is copied.
        let uri = original_uri(&parts).clone();
        let rebuilt = Request::from_parts(parts, Body::from(raw.clone()));
        let value = T::from_request(rebuilt, state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Self {
            value,
            method,
            uri,
            body: raw,
        })
    }
}

/// Reads a request body whole for its fingerprint, as axum's `Bytes` extractor does: within
/// the `DefaultBodyLimit` in the request's extensions (2 MiB when none is set), and
/// refusing a body that a `tower_http` `RequestBodyLimitLayer` cut off. Over the limit is
/// `413`, any other failure `400`, both problem+json — like every other answer the
/// library gives itself. The request head comes back untouched (never copied).
pub(crate) async fn buffer_body(parts: Parts, body: Body) -> Result<(Parts, Bytes), Response> {
    let (parts, body) = Request::from_parts(parts, body)
        .with_limited_body()
        .into_parts();
    match read_whole(body).await {
        Ok(bytes) => Ok((parts, bytes)),
        Err(err) => Err(crate::rejection::problem_from(body_refused(&err)).await),
    }
}

/// Reads `body` to its end (trailers are dropped, as `collect().to_bytes()` drops them). A
/// body that arrives in one frame, as hyper hands over a small request body, comes back
/// as that frame: no copy and no list of frames to allocate.
async fn read_whole(mut body: Body) -> Result<Bytes, axum::Error> {
    let mut first = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        match &mut joined {
            Some(joined) => joined.extend_from_slice(&data),
            None if first.is_empty() => first = data,
            None => {
                // Not sized from the body's size hint: that is the client's Content-Length,
                // and a body limit may be off.
                let mut both = BytesMut::with_capacity(first.len() + data.len());
                both.extend_from_slice(&first);
                both.extend_from_slice(&data);
                joined = Some(both);
            }
        }
    }
    Ok(joined.map_or(first, BytesMut::freeze))
}

/// What axum's `Bytes` extractor answers for a body that failed while buffering: `413`
/// when a length limit (axum's or `tower_http`'s) cut it off, `400` otherwise.
fn body_refused(err: &axum::Error) -> Response {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(cause) = source {
        if cause.is::<http_body_util::LengthLimitError>() {
            let message = "Failed to buffer the request body: length limit exceeded";
            return (http::StatusCode::PAYLOAD_TOO_LARGE, message).into_response();
        }
        source = cause.source();
    }
    let message = format!("Failed to buffer the request body: {err}");
    (http::StatusCode::BAD_REQUEST, message).into_response()
}

/// The URI the client sent. Behind `Router::nest` the request's URI has lost its prefix
/// (and the prefix's path parameters), which must not drop out of the fingerprint.
pub(crate) fn original_uri(parts: &Parts) -> &http::Uri {
    parts
        .extensions
        .get::<axum::extract::OriginalUri>()
        .map_or(&parts.uri, |original| &original.0)
}

impl<T> Hashed<T> {
    /// The inner extractor's value and the request's fingerprint (computed when the
    /// engine first needs it: a replay from the replay cache does not).
    pub fn into_parts(self, mode: FingerprintMode) -> (T, RequestFingerprint) {
        let fingerprint = RequestFingerprint::new(mode, self.method, self.uri, self.body);
        (self.value, fingerprint)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body::Frame;
    use http_body_util::StreamBody;

    use super::*;

    /// A body made of `frames` (data, or trailers for `None`).
    fn framed(frames: &[Option<&'static str>]) -> Body {
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = frames
            .iter()
            .map(|frame| {
                Ok(match frame {
                    Some(data) => Frame::data(Bytes::from_static(data.as_bytes())),
                    None => Frame::trailers(http::HeaderMap::new()),
                })
            })
            .collect();
        Body::new(StreamBody::new(futures_util::stream::iter(frames)))
    }

    #[tokio::test]
    async fn a_body_in_one_frame_is_that_frame() {
        let frame = Bytes::from_static(b"{\"amount\":1}");
        let read = read_whole(Body::from(frame.clone())).await.unwrap();
        assert_eq!(read, frame);
        assert_eq!(read.as_ptr(), frame.as_ptr(), "not copied");
    }

    #[tokio::test]
    async fn frames_are_joined_in_order_and_trailers_dropped() {
        let cases: [(&[Option<&'static str>], &str); 5] = [
            (&[], ""),
            (&[Some(""), Some("ab")], "ab"),
            (&[Some("ab"), Some("cd"), Some("ef")], "abcdef"),
            (&[Some("ab"), Some(""), Some("cd"), None], "abcd"),
            (&[None], ""),
        ];
        for (frames, whole) in cases {
            let read = read_whole(framed(frames)).await.unwrap();
            assert_eq!(read, whole, "{frames:?}");
        }
    }

    /// The contract's `413` for a body over the limit holds for a body in several frames
    /// too: the limit cuts it off in the middle, and the error is answered `413`.
    #[tokio::test]
    async fn a_body_in_frames_over_the_limit_is_413() {
        let body = framed(&[Some("ab"), Some("cd"), Some("ef")]);
        let limited = Body::new(http_body_util::Limited::new(body, 5));
        let err = read_whole(limited).await.unwrap_err();
        assert_eq!(
            body_refused(&err).status(),
            http::StatusCode::PAYLOAD_TOO_LARGE
        );
        let within = Body::new(http_body_util::Limited::new(
            framed(&[Some("ab"), Some("cd")]),
            5,
        ));
        assert_eq!(read_whole(within).await.unwrap(), "abcd");
    }

    #[tokio::test]
    async fn a_failing_body_fails() {
        let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"ab"))),
            Err(std::io::Error::other("client went away")),
        ];
        let body = Body::new(StreamBody::new(futures_util::stream::iter(frames)));
        let err = read_whole(body).await.unwrap_err();
        assert!(err.to_string().contains("client went away"), "{err}");
    }
}
