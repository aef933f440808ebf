//! RFC 9457 `application/problem+json` responses with a stable `code`.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;

use crate::key::KeyError;

/// The media type of problem documents.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// A problem document (RFC 9457) with a stable machine-readable `code`.
///
/// `type` is `urn:idempotent:problem:<code>`; clients should branch on `code`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct Problem {
    /// A URI naming the problem type.
    #[serde(rename = "type")]
    pub type_uri: String,
    /// A short, human-readable summary of the problem type.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// A human-readable explanation of this occurrence.
    pub detail: String,
    /// A stable machine-readable code, e.g. `idempotency_key_reused`.
    pub code: String,
    /// A finer machine-readable reason, where a code has several (e.g. `too_long`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Seconds after which a retry may succeed (also sent as `Retry-After`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
}

impl Problem {
    /// A problem with the given status, code, title and detail.
    pub fn new(
        status: StatusCode,
        code: &str,
        title: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            type_uri: format!("urn:idempotent:problem:{code}"),
            title: title.into(),
            status: status.as_u16(),
            detail: detail.into(),
            code: code.to_owned(),
            reason: None,
            retry_after: None,
        }
    }

    /// Adds a finer `reason`.
    pub fn with_reason(mut self, reason: &str) -> Self {
        self.reason = Some(reason.to_owned());
        self
    }

    /// Adds `Retry-After` (seconds), in the body and as a header.
    pub fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// The problem document as JSON bytes.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a problem document always serialises")
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, self.to_json()).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// The `400` problem for a refused key.
pub(crate) fn key_problem(err: &KeyError) -> Problem {
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
            "{} Send one Idempotency-Key header with 1 to 255 printable ASCII characters, \
             e.g. a UUID, and reuse it on every retry of the same operation.",
            sentence(&err.to_string()).unwrap_or_default()
        ),
    )
    .with_reason(reason)
}

/// `message` trimmed, its first letter capitalised, ending in punctuation; `None` if blank.
pub(crate) fn sentence(message: &str) -> Option<String> {
    let message = message.trim();
    let mut chars = message.chars();
    let first = chars.next()?;
    let mut out: String = first.to_uppercase().chain(chars).collect();
    if !out.ends_with(['.', '!', '?']) {
        out.push('.');
    }
    Some(out)
}

/// The stable problem codes this crate answers with.
pub mod codes {
    /// No `Idempotency-Key` header (`400`).
    pub const KEY_MISSING: &str = "idempotency_key_missing";
    /// A key that is blank, too long, has bad characters or bad quoting, or is sent
    /// twice (`400`); `reason` says which.
    pub const KEY_INVALID: &str = "idempotency_key_invalid";
    /// The key was used with another request (`422`).
    pub const KEY_REUSED: &str = "idempotency_key_reused";
    /// The original request with this key is still running (`409` + `Retry-After`).
    pub const IN_PROGRESS: &str = "request_in_progress";
    /// The request body is over the `DefaultBodyLimit` (`413`): refused while the library
    /// read it for the fingerprint, before the key was claimed.
    pub const PAYLOAD_TOO_LARGE: &str = "payload_too_large";
    /// The request body could not be read (`400`; e.g. the client broke off sending it):
    /// refused before the key was claimed.
    pub const BAD_REQUEST: &str = "bad_request";
    /// The store cannot be reached; the handler did not run (`503`).
    pub const STORE_UNAVAILABLE: &str = "idempotency_store_unavailable";
    /// A step of a multi-step handler found that this execution no longer holds the
    /// key's lease (another execution took it over), so it did not run or its output was
    /// not recorded (`503` + `Retry-After`): the completed steps are kept, and a retry
    /// resumes after them.
    pub const LEASE_LOST: &str = "idempotency_lease_lost";
    /// The handler panicked; its claim was released (`500`).
    pub const HANDLER_PANICKED: &str = "internal_error";
    /// A step of a multi-step handler could not be run or recorded (`500`), when the
    /// handler answers with the [`StepError`](crate::StepError): its name was invalid or
    /// used twice, a step ran inside a transactional handler (nothing ran; a retry may
    /// run again), or its output could not be recorded (not serialisable, over the cap;
    /// this answer is recorded and replayed, so the step never runs again).
    pub const STEP_FAILED: &str = "step_failed";
    /// An at-most-once step's earlier call has an unknown outcome, and its `verify`
    /// could not tell (`500`): the step was not called again. The claim is given up
    /// with its steps kept; a retry checks again; an operator resolves it.
    pub const STEP_OUTCOME_UNKNOWN: &str = "step_outcome_unknown";
    /// A transactional handler runs on an engine whose store is of another database
    /// (`500`); nothing was run.
    pub const TRANSACTION_UNSUPPORTED: &str = "transaction_unsupported";
    /// A transactional handler's transaction failed in the database (`500`): a failed
    /// statement left it aborted (Postgres), or COMMIT refused it (a deferred constraint,
    /// a serialization failure). Rolled back, the key released.
    pub const TRANSACTION_ABORTED: &str = "transaction_aborted";
    /// The handler's scope argument yielded an empty scope (`500`): nothing ran, since
    /// an empty scope would share one key space between callers.
    pub const SCOPE_EMPTY: &str = "idempotency_scope_empty";
    /// The handler ran past its maximum duration and was interrupted (`500`, recorded and
    /// replayed: it may have taken effect, so it never runs again under the key).
    pub const INTERRUPTED: &str = "request_interrupted";
    /// An [`IdempotencyLayer`](crate::layer::IdempotencyLayer) found no scope for the
    /// request (`500`): nothing ran, since keys are never shared between callers.
    pub const SCOPE_MISSING: &str = "idempotency_scope_missing";
    /// A replay of a response whose body was over the store cap: the operation ran and
    /// its status and headers are replayed, the body was not kept.
    pub const RESPONSE_NOT_STORED: &str = "idempotency_response_not_stored";
    /// An incoming webhook failed verification (`401`; feature `webhooks`): a Standard
    /// Webhooks header missing, a bad timestamp or one outside the tolerance, or no
    /// matching signature; `reason` says which. Nothing was claimed or stored.
    pub const WEBHOOK_UNVERIFIED: &str = "webhook_unverified";
    /// A verified webhook's `webhook-id` cannot be an idempotency key (`400`; feature
    /// `webhooks`): blank, too long, or with characters outside printable ASCII.
    pub const WEBHOOK_ID_INVALID: &str = "webhook_id_invalid";
}
