//! The answers the engine gives itself: replays, `409`, `422`, `503`, `500`, all but
//! replays as problem+json, marked as the library's (see [`crate::rendering`]).

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};

use super::policy::REPLAYED_HEADER;
use crate::problem::{Problem, codes};
use crate::store::StoredResponse;

/// Headers that describe the original body: a replay whose body was not kept (it carries
/// a problem document instead) drops them, since they would describe bytes it does not
/// send — a client would decode the problem as gzip, or cache it under the old `ETag`.
const DESCRIBE_THE_BODY: [&str; 9] = [
    "content-type",
    "content-encoding",
    "content-range",
    "content-md5",
    "digest",
    "content-digest",
    "repr-digest",
    "etag",
    "last-modified",
];

/// The replay header's name, checked at compile time: inserting it by `&str` would
/// allocate the name anew for every replayed response.
const REPLAYED: HeaderName = HeaderName::from_static(REPLAYED_HEADER);

/// Rebuilds a stored response, marked as a replay.
pub(super) fn replay(stored: StoredResponse) -> Response {
    let (status, headers, body) = replay_parts(&stored);
    assembled(status, headers, body, stored.body.is_some())
}

/// A response of these parts; one whose stored body was not kept carries the library's
/// problem saying so, which an application's renderer may give its own body.
pub(super) fn assembled(
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    body_kept: bool,
) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    if body_kept {
        response
    } else {
        crate::rendering::mark(response, body_not_kept(status))
    }
}

/// What [`replay`] answers, in parts: for the replay cache, which builds them once.
pub(super) fn replay_parts(stored: &StoredResponse) -> (StatusCode, HeaderMap, Bytes) {
    let (status, mut headers, body) = stored_parts(stored);
    headers.insert(REPLAYED, HeaderValue::from_static("true"));
    (status, headers, body)
}

/// Rebuilds a stored response (a body that was not kept becomes a problem document).
pub(super) fn stored_answer(stored: StoredResponse) -> Response {
    let (status, headers, body) = stored_parts(&stored);
    assembled(status, headers, body, stored.body.is_some())
}

/// The problem a response whose body was not kept is answered with.
fn body_not_kept(status: StatusCode) -> Problem {
    Problem::new(
        status,
        codes::RESPONSE_NOT_STORED,
        "Response not stored",
        "The original request completed with this status, but its body was not kept \
         (larger than the idempotency store keeps, still streaming at the handler's \
         maximum duration, or failed while it was sent), so it cannot be replayed. \
         The operation was not run again; fetch the resource (see Location, if \
         present) instead.",
    )
}

/// The status, headers and body a stored response is answered with.
fn stored_parts(stored: &StoredResponse) -> (StatusCode, HeaderMap, Bytes) {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body_kept = stored.body.is_some();
    let body = match &stored.body {
        Some(body) => body.clone(),
        None => Bytes::from(body_not_kept(status).to_json()),
    };
    let mut headers = HeaderMap::with_capacity(stored.headers.len() + 2);
    for (name, value) in &stored.headers {
        if !body_kept && DESCRIBE_THE_BODY.contains(&name.as_str()) {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(name, value);
        }
    }
    if !body_kept {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(crate::problem::PROBLEM_JSON),
        );
    }
    (status, headers, body)
}

#[cfg(feature = "sql")]
pub(super) fn transaction_unsupported(database: &str) -> Response {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        codes::TRANSACTION_UNSUPPORTED,
        "Transactional handler misconfigured",
        format!(
            "This handler writes through a {database} transaction, but the idempotency engine's store is not a {database} store. Nothing was run."
        ),
    )
    .into_answer()
}

#[cfg(feature = "sql")]
pub(super) fn transaction_aborted() -> Response {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        codes::TRANSACTION_ABORTED,
        "Transaction aborted",
        "The handler's database transaction failed (a statement failed and was not recovered with a savepoint, or the database refused the commit); nothing was written. It is safe to retry with the same key.",
    )
    .into_answer()
}

#[cfg(feature = "sql")]
pub(super) fn lease_lost() -> Response {
    Problem::new(
        StatusCode::CONFLICT,
        codes::IN_PROGRESS,
        "Request in progress",
        "This request's claim on the idempotency key was taken over by a retry before it could commit; its writes were rolled back. Retry with the same key.",
    )
    .with_retry_after(1)
    .into_answer()
}

pub(super) fn in_progress(retry_after: Duration) -> Response {
    let secs = retry_after.as_secs().max(1);
    Problem::new(
        StatusCode::CONFLICT,
        codes::IN_PROGRESS,
        "Request in progress",
        "A request with this idempotency key is still being processed. Retry with the same key after Retry-After seconds.",
    )
    .with_retry_after(secs)
    .into_answer()
}

/// The record of a handler interrupted at its maximum duration.
pub(super) fn interrupted(max: Duration) -> StoredResponse {
    let problem = Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        codes::INTERRUPTED,
        "Request interrupted",
        format!(
            "The request ran longer than its maximum duration ({}s) and was interrupted; it \
             may or may not have taken effect. It will not run again under this key: check \
             the resource, or use a new key for a new attempt.",
            max.as_secs()
        ),
    );
    StoredResponse {
        status: problem.status,
        headers: vec![(
            header::CONTENT_TYPE.as_str().to_owned(),
            crate::problem::PROBLEM_JSON.as_bytes().to_vec(),
        )],
        body: Some(problem.to_json().into()),
    }
}

pub(super) fn scope_empty() -> Response {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        codes::SCOPE_EMPTY,
        "Idempotency scope missing",
        "The server could not tell whose idempotency key this is (its scope is empty), so the request was not processed. This is a server misconfiguration; retrying will not help.",
    )
    .into_answer()
}

pub(super) fn key_reused() -> Response {
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        codes::KEY_REUSED,
        "Idempotency key reused",
        "This idempotency key was already used for a different request (method, path, query or body differ). Use a new key for a new operation.",
    )
    .into_answer()
}

pub(super) fn store_unavailable() -> Response {
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        codes::STORE_UNAVAILABLE,
        "Idempotency store unavailable",
        "The request was not processed because its idempotency key could not be checked. Retry with the same key.",
    )
    .with_retry_after(1)
    .into_answer()
}

/// The answer to a handler that panicked.
pub(super) fn handler_panicked() -> Response {
    internal_error("The handler failed; it is safe to retry with the same key.")
}

pub(super) fn internal_error(detail: &str) -> Response {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        codes::HANDLER_PANICKED,
        "Internal server error",
        detail,
    )
    .into_answer()
}
