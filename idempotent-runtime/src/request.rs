//! The front door: what the engine needs from an HTTP request — its key, its body read
//! whole, and what its fingerprint covers — read the same way for the attribute's
//! extractors ([`macro_support`](crate::macro_support)) and for the tower layer
//! ([`layer`](crate::layer)). The scope comes from [`Scope`](crate::scope::Scope) on
//! both sides, and the engine refuses an empty one.

use axum::RequestExt;
use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request};
use axum::response::Response;
use bytes::BytesMut;
use http::request::Parts;
use http::{Method, StatusCode, Uri};
use http_body_util::BodyExt;

use crate::engine::Idempotency;
use crate::fingerprint::{FingerprintMode, RequestFingerprint};
use crate::key::{self, KeyError};
use crate::metrics::{self, Outcome, UNNAMED};
use crate::problem::{Problem, codes, sentence};

/// The `handler` label a refused key counts under.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeyLabel {
    /// The handler's name, as its policy gives it (the layer's).
    Handler(Option<&'static str>),
    /// The request's route: the attribute refuses a key in an extractor, before the
    /// handler's name is in reach.
    Route,
}

/// Reads the request's key from the engine's key header. `Ok(None)`: the request has none
/// and the policy lets it through unprotected (`key_optional`). A missing or malformed
/// key is counted under `label`; the caller answers it with
/// [`key_problem`](crate::problem::key_problem) (`400`).
pub(crate) fn read_key(
    parts: &Parts,
    engine: &Idempotency,
    key_optional: bool,
    label: KeyLabel,
) -> Result<Option<String>, KeyError> {
    match key::parse_header(&parts.headers, engine.header_name()) {
        Ok(key) => Ok(Some(key)),
        Err(KeyError::Missing) if key_optional => Ok(None),
        Err(err) => {
            let outcome = Outcome::of_key_error(&err);
            match label {
                KeyLabel::Handler(name) => metrics::count(name, outcome),
                KeyLabel::Route => {
                    let route = parts.extensions.get::<MatchedPath>();
                    let route = route.map_or(UNNAMED.to_owned(), |path| path.as_str().to_owned());
                    metrics::count_labelled(route, outcome);
                }
            }
            Err(err)
        }
    }
}

/// What a request's fingerprint covers: its method, the URI the client sent and its
/// whole body. Shares the request's bytes: nothing is copied.
#[derive(Debug)]
pub(crate) struct Covered {
    method: Method,
    uri: Uri,
    body: Bytes,
}

impl Covered {
    /// The request's body.
    #[cfg(feature = "webhooks")]
    pub(crate) fn body(&self) -> &[u8] {
        &self.body
    }

    /// The request's fingerprint in `mode`, hashed only if the engine needs it (a replay
    /// from the replay cache does not).
    pub(crate) fn fingerprint(self, mode: FingerprintMode) -> RequestFingerprint {
        RequestFingerprint::new(mode, self.method, self.uri, self.body)
    }
}

/// Reads the request's body whole (see [`buffer_body`]) and gives back the request,
/// rebuilt around those bytes for the handler, with what its fingerprint covers.
pub(crate) async fn read_body(parts: Parts, body: Body) -> Result<(Request, Covered), Response> {
    let (parts, body) = buffer_body(parts, body).await?;
    let covered = Covered {
        method: parts.method.clone(),
        // A clone shares the URI's bytes: nothing is copied.
        uri: original_uri(&parts).clone(),
        body: body.clone(),
    };
    Ok((Request::from_parts(parts, Body::from(body)), covered))
}

/// Reads a request body whole for its fingerprint, as axum's `Bytes` extractor does: within
/// the `DefaultBodyLimit` in the request's extensions (2 MiB when none is set), and
/// refusing a body that a `tower_http` `RequestBodyLimitLayer` cut off. Over the limit is
/// `413`, any other failure `400`, both problem+json — like every other answer the
/// library gives itself. The request head comes back untouched (never copied).
async fn buffer_body(parts: Parts, body: Body) -> Result<(Parts, Bytes), Response> {
    let (parts, body) = Request::from_parts(parts, body)
        .with_limited_body()
        .into_parts();
    match read_whole(body).await {
        Ok(bytes) => Ok((parts, bytes)),
        Err(err) => {
            let mut refused = body_refused(&err).into_answer();
            // Refused before the handler ran, as an extractor's rejection is.
            refused
                .extensions_mut()
                .insert(crate::rejection::ExtractorRejection);
            Err(refused)
        }
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
fn body_refused(err: &axum::Error) -> Problem {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(cause) = source {
        if cause.is::<http_body_util::LengthLimitError>() {
            return Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                codes::PAYLOAD_TOO_LARGE,
                "Payload Too Large",
                "Failed to buffer the request body: length limit exceeded.",
            );
        }
        source = cause.source();
    }
    let detail = format!("Failed to buffer the request body: {err}");
    Problem::new(
        StatusCode::BAD_REQUEST,
        codes::BAD_REQUEST,
        "Bad Request",
        sentence(&detail).unwrap_or(detail),
    )
}

/// The URI the client sent. Behind `Router::nest` the request's URI has lost its prefix
/// (and the prefix's path parameters), which must not drop out of the fingerprint.
fn original_uri(parts: &Parts) -> &http::Uri {
    parts
        .extensions
        .get::<axum::extract::OriginalUri>()
        .map_or(&parts.uri, |original| &original.0)
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
            body_refused(&err).status,
            http::StatusCode::PAYLOAD_TOO_LARGE.as_u16()
        );
        let within = Body::new(http_body_util::Limited::new(
            framed(&[Some("ab"), Some("cd")]),
            5,
        ));
        assert_eq!(read_whole(within).await.unwrap(), "abcd");
    }

    /// The codes the published policy names for a refused body are the ones answered.
    #[tokio::test]
    async fn a_refused_body_is_answered_with_its_published_code() {
        let over = Body::new(http_body_util::Limited::new(framed(&[Some("abcdef")]), 5));
        let broken: Vec<Result<Frame<Bytes>, std::io::Error>> =
            vec![Err(std::io::Error::other("client went away"))];
        let broken = Body::new(StreamBody::new(futures_util::stream::iter(broken)));
        for (body, status, code) in [
            (
                over,
                http::StatusCode::PAYLOAD_TOO_LARGE,
                crate::problem::codes::PAYLOAD_TOO_LARGE,
            ),
            (
                broken,
                http::StatusCode::BAD_REQUEST,
                crate::problem::codes::BAD_REQUEST,
            ),
        ] {
            let (parts, body) = Request::new(body).into_parts();
            let answer = buffer_body(parts, body).await.unwrap_err();
            assert_eq!(answer.status(), status);
            let body = answer.into_body().collect().await.unwrap().to_bytes();
            let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(problem["code"], code, "{problem}");
        }
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
