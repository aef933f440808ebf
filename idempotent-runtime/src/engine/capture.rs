//! Reading a handler's response body for the record, without holding more of it than the
//! store keeps and without waiting on it forever.
//!
//! At most `cap + 1` bytes are buffered: enough to know whether the body fits the store.
//! A body over the cap is recorded without its bytes and the client gets the buffered
//! prefix followed by the rest, streamed as the handler produces it. A body still being
//! produced when the handler's maximum duration runs out (an endless stream, a stuck
//! producer) is treated the same way, so it cannot hold its claim forever. A body that
//! fails while it is read comes after the handler answered — its side effect happened —
//! so it is recorded too (without bytes), never released for a retry to run again.
//!
//! The headers recorded are the response's own, less those that describe one response
//! rather than the operation ([`NEVER_REPLAYED`]) and the handler's exclusions.

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::policy::NEVER_REPLAYED;

/// What reading a response body up to the store cap found.
pub(super) enum BodyRead {
    /// The whole body, within the cap.
    Whole(Bytes),
    /// Not all of it: over the cap, or still going at the deadline. `answer` is the body
    /// to send the client: the bytes read so far, then the rest as it comes.
    Partial {
        /// Why the body is not kept.
        reason: PartialReason,
        /// What the client gets.
        answer: Body,
    },
    /// The body failed while it was read.
    Failed(String),
}

/// Why a body was not kept whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PartialReason {
    /// More than the store cap.
    OverCap,
    /// Still being produced when the maximum duration ran out.
    TimedOut,
}

impl PartialReason {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::OverCap => "over_cap",
            Self::TimedOut => "max_duration",
        }
    }
}

/// Reads `body` until it ends, passes `cap` bytes, fails, or `deadline` comes.
pub(super) async fn read_capped(mut body: Body, cap: usize, deadline: Instant) -> BodyRead {
    let mut buffered = BytesMut::new();
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_elapsed) => return partial(PartialReason::TimedOut, buffered, body),
            Ok(None) => return BodyRead::Whole(buffered.freeze()),
            Ok(Some(Err(err))) => return BodyRead::Failed(err.to_string()),
            Ok(Some(Ok(frame))) => frame,
        };
        // Trailers are not recorded (nor replayed): they rarely describe the operation.
        if let Ok(data) = frame.into_data() {
            buffered.extend_from_slice(&data);
            if buffered.len() > cap {
                return partial(PartialReason::OverCap, buffered, body);
            }
        }
    }
}

fn partial(reason: PartialReason, read: BytesMut, rest: Body) -> BodyRead {
    let prefix = futures_util::stream::once(std::future::ready(Ok(read.freeze())));
    let answer = Body::from_stream(prefix.chain(rest.into_data_stream()));
    BodyRead::Partial { reason, answer }
}

/// The response headers to store, in order: every one but those never replayed, those
/// a `Connection` field names, and the handler's exclusions.
pub(super) fn replayable_headers(
    headers: &http::HeaderMap,
    excluded: &[&str],
) -> Vec<(String, Vec<u8>)> {
    let connection_scoped: Vec<String> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    headers
        .iter()
        .filter(|(name, _)| {
            let name = name.as_str();
            !NEVER_REPLAYED.contains(&name)
                && !connection_scoped.iter().any(|scoped| scoped == name)
                && !excluded.iter().any(|e| e.eq_ignore_ascii_case(name))
        })
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::time::Duration;

    use super::*;

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    /// A body of `chunks`, then (if `then_hang`) one that never ends.
    fn chunked(chunks: &[&'static str], then_hang: bool) -> Body {
        let items: Vec<Result<Bytes, Infallible>> = chunks
            .iter()
            .map(|c| Ok(Bytes::from_static(c.as_bytes())))
            .collect();
        let stream = futures_util::stream::iter(items);
        if then_hang {
            Body::from_stream(stream.chain(futures_util::stream::pending()))
        } else {
            Body::from_stream(stream)
        }
    }

    async fn collect(body: Body) -> Vec<u8> {
        body.collect().await.unwrap().to_bytes().to_vec()
    }

    #[tokio::test]
    async fn a_body_within_the_cap_is_whole() {
        match read_capped(chunked(&["ab", "cd"], false), 4, far()).await {
            BodyRead::Whole(bytes) => assert_eq!(bytes, "abcd"),
            _ => panic!("expected the whole body"),
        }
    }

    #[tokio::test]
    async fn over_the_cap_buffers_at_most_cap_plus_a_chunk_and_streams_the_rest() {
        match read_capped(chunked(&["ab", "cd", "ef", "gh"], false), 3, far()).await {
            BodyRead::Partial { reason, answer } => {
                assert_eq!(reason, PartialReason::OverCap);
                assert_eq!(collect(answer).await, b"abcdefgh", "the client gets it all");
            }
            _ => panic!("expected a partial read"),
        }
    }

    #[tokio::test]
    async fn an_endless_body_stops_at_the_deadline() {
        let deadline = Instant::now() + Duration::from_millis(50);
        match read_capped(chunked(&["data: 1\n\n"], true), 1024, deadline).await {
            BodyRead::Partial { reason, answer } => {
                assert_eq!(reason, PartialReason::TimedOut);
                let mut stream = answer.into_data_stream();
                assert_eq!(stream.next().await.unwrap().unwrap(), "data: 1\n\n");
            }
            _ => panic!("expected a partial read"),
        }
    }

    #[tokio::test]
    async fn a_failing_body_is_reported() {
        let items: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from_static(b"ab")),
            Err(std::io::Error::other("upstream closed")),
        ];
        let body = Body::from_stream(futures_util::stream::iter(items));
        match read_capped(body, 1024, far()).await {
            BodyRead::Failed(error) => assert!(error.contains("upstream closed"), "{error}"),
            _ => panic!("expected a failure"),
        }
    }
}
