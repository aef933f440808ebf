//! One logical call through the [`RetryPolicy`]: the loop the reqwest middleware and the
//! tower layer both drive, one attempt at a time, and what the caller learns about it
//! ([`CallReport`], [`ClientError`]).

use std::future::Future;
use std::time::{Duration, SystemTime};

use http::{Extensions, HeaderMap, HeaderValue, Method, StatusCode};
use idempotent_policy::{KEY_HEADER, REPLAYED_HEADER};
use tokio::time::Instant;
use tracing::Instrument;

use crate::key::CallKey;
use crate::policy::{AttemptOutcome, Decision, RetryPolicy, StopReason, may_retry};

/// What the caller learns about a call that got an answer, in the final response's
/// extensions ([`ResponseExt::call_report`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallReport {
    /// The `Idempotency-Key` field value sent on every attempt, if the call had a key.
    pub key: Option<HeaderValue>,
    /// Requests sent, the answered one included.
    pub attempts: u32,
    /// Whether the answer is a replay of an earlier execution (`Idempotent-Replayed:
    /// true`): the server had already acted on this key, on an attempt whose answer was
    /// lost or on an earlier call.
    pub replayed: bool,
}

/// Why a call ended without an answer, besides the transport's own error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The request may be retried but its body is a stream, which cannot be sent twice.
    /// Buffer the body (bytes, a string, JSON) to have the request retried.
    #[error(
        "the request body is a stream and cannot be sent again; send a buffered body (bytes, string, JSON) to have the request retried"
    )]
    BodyNotReplayable,
    /// The call's deadline passed while an attempt had no answer yet.
    #[error("the call's deadline of {deadline:?} passed during attempt {attempts}")]
    DeadlineExceeded {
        /// The policy's deadline.
        deadline: Duration,
        /// Requests sent.
        attempts: u32,
    },
    /// The last attempt timed out and the policy allows no other.
    #[error("attempt {attempts} got no answer within {timeout:?} and is not retried ({reason})")]
    AttemptTimedOut {
        /// The policy's attempt timeout.
        timeout: Duration,
        /// Requests sent.
        attempts: u32,
        /// Why there is no other attempt (`attempts_exhausted`, `deadline_reached`,
        /// `not_retryable`).
        reason: &'static str,
    },
}

/// Reads what the client half says about a response: whether it is a replay, and the
/// [`CallReport`] of the call that got it.
///
/// ```
/// use idempotent_client::ResponseExt;
///
/// let response = http::Response::builder()
///     .header("idempotent-replayed", "true")
///     .body(())
///     .unwrap();
/// assert!(response.is_replayed());
/// assert!(response.call_report().is_none()); // not sent through the client half
/// ```
pub trait ResponseExt {
    /// Whether the server answered with a replay (`Idempotent-Replayed: true`): the
    /// operation ran before, on an earlier attempt or call with the same key.
    fn is_replayed(&self) -> bool;

    /// The report of the call that got this response, when it went through the client
    /// half.
    fn call_report(&self) -> Option<&CallReport>;
}

impl<B> ResponseExt for http::Response<B> {
    fn is_replayed(&self) -> bool {
        replayed(self.headers())
    }

    fn call_report(&self) -> Option<&CallReport> {
        self.extensions().get()
    }
}

#[cfg(feature = "reqwest")]
impl ResponseExt for reqwest::Response {
    fn is_replayed(&self) -> bool {
        replayed(self.headers())
    }

    fn call_report(&self) -> Option<&CallReport> {
        self.extensions().get()
    }
}

fn replayed(headers: &HeaderMap) -> bool {
    headers
        .get(REPLAYED_HEADER)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"true"))
}

/// A response as the call sees it: a head the policy reads, extensions for the report.
pub(crate) trait Answer {
    fn status(&self) -> StatusCode;
    fn headers(&self) -> &HeaderMap;
    fn extensions_mut(&mut self) -> &mut Extensions;
}

impl<B> Answer for http::Response<B> {
    fn status(&self) -> StatusCode {
        self.status()
    }

    fn headers(&self) -> &HeaderMap {
        self.headers()
    }

    fn extensions_mut(&mut self) -> &mut Extensions {
        self.extensions_mut()
    }
}

#[cfg(feature = "reqwest")]
impl Answer for reqwest::Response {
    fn status(&self) -> StatusCode {
        self.status()
    }

    fn headers(&self) -> &HeaderMap {
        self.headers()
    }

    fn extensions_mut(&mut self) -> &mut Extensions {
        self.extensions_mut()
    }
}

/// The key a request is sent with, written to its headers: the [`CallKey`] given in its
/// extensions (replacing any `Idempotency-Key` field), else the field the caller set,
/// else a generated key when the policy generates keys and the method is not idempotent.
pub(crate) fn attach_key(
    method: &Method,
    headers: &mut HeaderMap,
    given: Option<&CallKey>,
    policy: &RetryPolicy,
) -> Option<HeaderValue> {
    let generated;
    let key = match given {
        Some(key) => key,
        None => match headers.get(KEY_HEADER) {
            Some(set_by_caller) => return Some(set_by_caller.clone()),
            None if policy.generates_keys() && !crate::policy::is_idempotent_method(method) => {
                generated = CallKey::generate();
                &generated
            }
            None => return None,
        },
    };
    headers.insert(KEY_HEADER, key.header_value());
    Some(key.header_value())
}

/// How a call ended.
pub(crate) enum Ended<T, E> {
    /// An answer: final, or the last retryable one; its extensions hold the
    /// [`CallReport`].
    Answer(T),
    /// The transport's error on the last attempt.
    Failed(E),
    /// A [`ClientError`] (deadline, attempt timeout).
    Client(ClientError),
}

/// One call in progress: its attempts, the time it started, whether it may be retried.
#[derive(Debug)]
pub(crate) struct Call {
    policy: RetryPolicy,
    started: Instant,
    attempts: u32,
    retryable: bool,
    key: Option<HeaderValue>,
    span: tracing::Span,
}

impl Call {
    /// A call of `method` to `target`, keyed by `key` if any.
    pub(crate) fn start(
        policy: RetryPolicy,
        method: &Method,
        target: &dyn std::fmt::Display,
        key: Option<HeaderValue>,
    ) -> Self {
        let key_text = key.as_ref().and_then(|k| k.to_str().ok()).unwrap_or("");
        let span = tracing::info_span!(
            "idempotent_call",
            %method,
            %target,
            key = key_text,
        );
        Self {
            policy,
            started: Instant::now(),
            attempts: 0,
            retryable: may_retry(method, key.is_some()),
            key,
            span,
        }
    }

    /// Whether the request may be sent more than once (so its body must be kept).
    pub(crate) fn retryable(&self) -> bool {
        self.retryable
    }

    /// Sends one attempt (`attempt`, bounded by the attempt timeout and the deadline),
    /// decides, logs, and waits when the policy retries: `None` means "send the next
    /// attempt". `no_answer` says which transport errors mean "no answer head" (retried
    /// like a timeout); any other error ends the call.
    pub(crate) async fn attempt<T, E>(
        &mut self,
        attempt: impl Future<Output = Result<T, E>>,
        no_answer: impl Fn(&E) -> bool,
    ) -> Option<Ended<T, E>>
    where
        T: Answer,
        E: std::fmt::Display,
    {
        self.attempts += 1;
        let attempt_no = self.attempts;
        let remaining = self
            .policy
            .deadline()
            .saturating_sub(self.started.elapsed());
        let (limit, cut_by_deadline) = match self.policy.attempt_timeout() {
            Some(timeout) if timeout < remaining => (timeout, false),
            _ => (remaining, true),
        };
        let sent = tokio::time::timeout(limit, attempt)
            .instrument(self.span.clone())
            .await;
        let _in_call = self.span.enter();
        let (decision, ended, what) = match sent {
            Ok(Ok(answer)) => {
                let outcome = AttemptOutcome::Answer {
                    status: answer.status(),
                    headers: answer.headers(),
                };
                let decision = self.decide(outcome);
                (decision, Ended::Answer(answer), None)
            }
            Ok(Err(error)) if no_answer(&error) => {
                let decision = self.decide(AttemptOutcome::NoAnswer);
                let what = error.to_string();
                (decision, Ended::Failed(error), Some(what))
            }
            Ok(Err(error)) => {
                tracing::warn!(
                    attempt = attempt_no,
                    %error,
                    "attempt failed in a way a retry cannot mend; not retried"
                );
                return Some(Ended::Failed(error));
            }
            Err(_) if cut_by_deadline => {
                tracing::warn!(
                    attempt = attempt_no,
                    deadline = ?self.policy.deadline(),
                    "the call's deadline passed during the attempt"
                );
                return Some(Ended::Client(ClientError::DeadlineExceeded {
                    deadline: self.policy.deadline(),
                    attempts: attempt_no,
                }));
            }
            Err(_) => {
                let decision = self.decide(AttemptOutcome::NoAnswer);
                let error = ClientError::AttemptTimedOut {
                    timeout: limit,
                    attempts: attempt_no,
                    reason: match decision {
                        Decision::Stop(reason) => reason.as_str(),
                        Decision::Retry { .. } => "retried",
                    },
                };
                (decision, Ended::Client(error), Some("timed out".to_owned()))
            }
        };
        let status = match &ended {
            Ended::Answer(answer) => Some(answer.status().as_u16()),
            _ => None,
        };
        let error = what.as_deref().unwrap_or("");
        match decision {
            Decision::Retry {
                delay,
                asked_by_server,
            } => {
                tracing::info!(
                    attempt = attempt_no,
                    status,
                    error,
                    delay_ms = delay.as_millis() as u64,
                    retry_after = asked_by_server,
                    "attempt got no final answer; retrying"
                );
                drop(_in_call);
                tokio::time::sleep(delay).await;
                None
            }
            Decision::Stop(StopReason::Answered) => {
                tracing::debug!(attempt = attempt_no, status, "answered");
                Some(self.stamped(ended))
            }
            Decision::Stop(reason) => {
                tracing::warn!(
                    attempt = attempt_no,
                    status,
                    error,
                    reason = reason.as_str(),
                    "call ends without a final answer"
                );
                Some(self.stamped(ended))
            }
        }
    }

    fn decide(&self, outcome: AttemptOutcome<'_>) -> Decision {
        self.policy.decide(
            self.retryable,
            self.attempts,
            outcome,
            self.started.elapsed(),
            SystemTime::now(),
        )
    }

    /// `ended`, with the call's [`CallReport`] in its answer's extensions if it has one.
    fn stamped<T: Answer, E>(&self, mut ended: Ended<T, E>) -> Ended<T, E> {
        if let Ended::Answer(answer) = &mut ended {
            let report = CallReport {
                key: self.key.clone(),
                attempts: self.attempts,
                replayed: replayed(answer.headers()),
            };
            answer.extensions_mut().insert(report);
        }
        ended
    }
}
