//! The retry policy, written once for the reqwest middleware and the tower layer: which
//! requests may be retried at all, which answers are retried, how long to wait before the
//! next attempt, and when a call stops.
//!
//! Everything here is a pure function of what the call has met so far (its attempts, the
//! time spent, the last answer); the transports only send attempts and sleep.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, Method, StatusCode, header};
use rand::Rng;

/// How a call is retried: an attempt budget, a total deadline, an optional timeout per
/// attempt, exponential backoff with full jitter, and a cap on the `Retry-After` it
/// honours.
///
/// ```
/// use std::time::Duration;
/// use idempotent_client::RetryPolicy;
///
/// let policy = RetryPolicy::default()
///     .with_max_attempts(4)
///     .with_deadline(Duration::from_secs(10))
///     .with_attempt_timeout(Duration::from_secs(2))
///     .with_backoff(Duration::from_millis(100), Duration::from_secs(2))
///     .with_max_retry_after(Duration::from_secs(5));
/// assert_eq!(policy.max_attempts(), 4);
/// assert!(policy.backoff_ceiling(10) <= Duration::from_secs(2));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    deadline: Duration,
    attempt_timeout: Option<Duration>,
    base_backoff: Duration,
    max_backoff: Duration,
    max_retry_after: Duration,
    generate_keys: bool,
}

impl Default for RetryPolicy {
    /// Five attempts within 30 s, no timeout per attempt (the transport's own applies),
    /// backoff from 100 ms up to 5 s, `Retry-After` honoured up to 30 s, no generated
    /// keys.
    fn default() -> Self {
        Self {
            max_attempts: 5,
            deadline: Duration::from_secs(30),
            attempt_timeout: None,
            base_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            max_retry_after: Duration::from_secs(30),
            generate_keys: false,
        }
    }
}

impl RetryPolicy {
    /// At most `attempts` requests per call, the first included (at least one).
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The whole call, waits included, ends `deadline` after it started: an attempt
    /// running then is cut, and no retry starts whose wait would end past it.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// One attempt that has no answer head after `timeout` counts as a timeout (retried).
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// Exponential backoff: before retry `n` (from 0) the wait is drawn uniformly from
    /// zero to `base × 2ⁿ`, capped at `max` (full jitter).
    pub fn with_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.base_backoff = base;
        self.max_backoff = max.max(base);
        self
    }

    /// The longest `Retry-After` honoured: a longer one is waited for this long.
    pub fn with_max_retry_after(mut self, max: Duration) -> Self {
        self.max_retry_after = max;
        self
    }

    /// Gives every request without a key whose method is not idempotent (`POST`,
    /// `PATCH`) a new UUIDv4 key, so it is retried too. Only for APIs that deduplicate on
    /// `Idempotency-Key`: a server that ignores the header would run a retried `POST`
    /// twice.
    pub fn with_generated_keys(mut self) -> Self {
        self.generate_keys = true;
        self
    }

    /// Whether requests without a key get a generated one ([`with_generated_keys`](Self::with_generated_keys)).
    pub fn generates_keys(&self) -> bool {
        self.generate_keys
    }

    /// Requests per call, the first included.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The total time a call may take.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// The timeout of one attempt, if any.
    pub fn attempt_timeout(&self) -> Option<Duration> {
        self.attempt_timeout
    }

    /// The longest wait before retry `retry` (0 for the first retry): `base × 2^retry`,
    /// capped at the maximum backoff.
    pub fn backoff_ceiling(&self, retry: u32) -> Duration {
        // 2^31 × any base already exceeds any sensible cap; the shift cannot overflow.
        let factor = 1u32 << retry.min(31);
        self.base_backoff
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.max_backoff)
    }

    /// The wait before retry `retry` without a `Retry-After`: uniform in
    /// `0..=backoff_ceiling(retry)` (full jitter, so callers that failed together do not
    /// retry together).
    pub fn backoff(&self, retry: u32) -> Duration {
        let ceiling = self.backoff_ceiling(retry);
        let ceiling_nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rand::rng().random_range(0..=ceiling_nanos))
    }

    /// The wait a `Retry-After` asks for, capped at the policy's maximum.
    pub fn honoured_retry_after(&self, asked: Duration) -> Duration {
        asked.min(self.max_retry_after)
    }
}

/// Whether `method` is idempotent by definition (RFC 9110 §9.2.2): sending it twice has
/// the effect of sending it once, so it may be retried without a key.
pub fn is_idempotent_method(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// Whether a request may ever be sent twice: it is idempotent by method, or it carries an
/// idempotency key the server deduplicates on.
pub fn may_retry(method: &Method, has_key: bool) -> bool {
    has_key || is_idempotent_method(method)
}

/// Whether an answer with `status` is retried: `409` (the same key is still running),
/// `429`, `502`, `503` and `504`. Every other answer, any other 4xx included, is final.
pub fn is_retryable_status(status: StatusCode) -> bool {
    matches!(status.as_u16(), 409 | 429 | 502 | 503 | 504)
}

/// The wait `Retry-After` asks for, in delta-seconds (`120`) or as an HTTP-date (a date
/// already past is no wait); `None` when absent or malformed. `now` is the wall clock the
/// date is read against.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::{HeaderMap, HeaderValue};
/// use idempotent_client::policy::retry_after;
///
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480); // 21 Oct 2015 07:28:00 GMT
/// let mut headers = HeaderMap::new();
/// headers.insert("retry-after", HeaderValue::from_static("120"));
/// assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(120)));
/// headers.insert("retry-after", HeaderValue::from_static("Wed, 21 Oct 2015 07:28:30 GMT"));
/// assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(30)));
/// headers.insert("retry-after", HeaderValue::from_static("soon"));
/// assert_eq!(retry_after(&headers, now), None);
/// ```
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Digits beyond u64 are a wait longer than any cap: saturate instead of refusing.
        let seconds = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(seconds));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// What one attempt met, as the policy sees it.
#[derive(Debug, Clone, Copy)]
pub enum AttemptOutcome<'a> {
    /// No answer head: the connection failed, was reset or closed, or the attempt timed
    /// out. Whether the server acted is unknown.
    NoAnswer,
    /// An answer head arrived.
    Answer {
        /// Its status.
        status: StatusCode,
        /// Its headers (for `Retry-After`).
        headers: &'a HeaderMap,
    },
}

/// What the call does after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Wait `delay`, then send the next attempt.
    Retry {
        /// How long to wait.
        delay: Duration,
        /// Whether the server asked for the wait (`Retry-After`) rather than the backoff.
        asked_by_server: bool,
    },
    /// The call ends with this attempt's outcome.
    Stop(StopReason),
}

/// Why a call ended with the outcome it had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// A final answer: anything but `409`, `429`, `502`, `503` and `504`.
    Answered,
    /// The request is neither idempotent by method nor keyed: sent once, never again.
    NotRetryable,
    /// The attempt budget is spent.
    AttemptsExhausted,
    /// The next attempt would start after the deadline.
    DeadlineReached,
}

impl StopReason {
    /// A short name for logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            StopReason::Answered => "answered",
            StopReason::NotRetryable => "not_retryable",
            StopReason::AttemptsExhausted => "attempts_exhausted",
            StopReason::DeadlineReached => "deadline_reached",
        }
    }
}

impl RetryPolicy {
    /// The decision after attempt number `attempts` (from 1) met `outcome`, `elapsed`
    /// into the call; `retryable` says whether the request may be sent twice at all
    /// ([`may_retry`]), `now` is the wall clock for an HTTP-date `Retry-After`.
    pub fn decide(
        &self,
        retryable: bool,
        attempts: u32,
        outcome: AttemptOutcome<'_>,
        elapsed: Duration,
        now: SystemTime,
    ) -> Decision {
        let asked = match outcome {
            AttemptOutcome::Answer { status, .. } if !is_retryable_status(status) => {
                return Decision::Stop(StopReason::Answered);
            }
            _ if !retryable => return Decision::Stop(StopReason::NotRetryable),
            AttemptOutcome::Answer { headers, .. } => retry_after(headers, now),
            AttemptOutcome::NoAnswer => None,
        };
        if attempts >= self.max_attempts {
            return Decision::Stop(StopReason::AttemptsExhausted);
        }
        let (delay, asked_by_server) = match asked {
            Some(asked) => (self.honoured_retry_after(asked), true),
            None => (self.backoff(attempts.saturating_sub(1)), false),
        };
        if elapsed.saturating_add(delay) >= self.deadline {
            return Decision::Stop(StopReason::DeadlineReached);
        }
        Decision::Retry {
            delay,
            asked_by_server,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn policy(base_ms: u64, max_ms: u64) -> RetryPolicy {
        RetryPolicy::default().with_backoff(
            Duration::from_millis(base_ms),
            Duration::from_millis(max_ms),
        )
    }

    proptest! {
        #[test]
        fn the_ceiling_doubles_from_base_up_to_the_cap(
            base_ms in 1u64..2_000,
            max_ms in 1u64..120_000,
            retry in 0u32..64,
        ) {
            let policy = policy(base_ms, max_ms);
            let max = Duration::from_millis(max_ms.max(base_ms));
            let ceiling = policy.backoff_ceiling(retry);
            prop_assert!(ceiling <= max);
            let doubled = Duration::from_millis(base_ms).checked_mul(1 << retry.min(31));
            prop_assert_eq!(ceiling, doubled.map_or(max, |d| d.min(max)));
            prop_assert!(policy.backoff_ceiling(retry + 1) >= ceiling);
        }

        #[test]
        fn every_wait_is_between_zero_and_the_ceiling(
            base_ms in 0u64..2_000,
            max_ms in 0u64..60_000,
            retry in 0u32..40,
        ) {
            let policy = policy(base_ms, max_ms);
            for _ in 0..16 {
                prop_assert!(policy.backoff(retry) <= policy.backoff_ceiling(retry));
            }
        }

        #[test]
        fn waits_are_spread_over_the_whole_range(
            base_ms in 1u64..2_000,
            max_ms in 1u64..60_000,
            retry in 0u32..40,
        ) {
            // Full jitter: 64 draws all in one half of the range has odds of 2⁻⁶³.
            let policy = policy(base_ms, max_ms);
            let half = policy.backoff_ceiling(retry) / 2;
            let draws: Vec<Duration> = (0..64).map(|_| policy.backoff(retry)).collect();
            prop_assert!(draws.iter().any(|d| *d < half), "{draws:?}");
            prop_assert!(draws.iter().any(|d| *d >= half), "{draws:?}");
        }

        #[test]
        fn a_retry_after_is_honoured_up_to_the_cap(
            asked_s in 0u64..100_000,
            cap_ms in 0u64..100_000,
        ) {
            let policy = RetryPolicy::default()
                .with_max_retry_after(Duration::from_millis(cap_ms))
                .with_deadline(Duration::MAX);
            let headers = headers_with_retry_after(&asked_s.to_string());
            let decision = policy.decide(true, 1, answer(503, &headers), Duration::ZERO, SystemTime::now());
            let delay = Duration::from_secs(asked_s).min(Duration::from_millis(cap_ms));
            prop_assert_eq!(decision, Decision::Retry { delay, asked_by_server: true });
        }

        #[test]
        fn no_retry_waits_past_the_deadline(
            deadline_ms in 0u64..10_000,
            elapsed_ms in 0u64..10_000,
            attempts in 1u32..5,
        ) {
            let policy = policy(50, 5_000)
                .with_deadline(Duration::from_millis(deadline_ms))
                .with_max_attempts(10);
            let elapsed = Duration::from_millis(elapsed_ms);
            match policy.decide(true, attempts, AttemptOutcome::NoAnswer, elapsed, SystemTime::now()) {
                Decision::Retry { delay, .. } => prop_assert!(elapsed + delay < policy.deadline()),
                Decision::Stop(reason) => prop_assert_eq!(reason, StopReason::DeadlineReached),
            }
        }
    }

    fn headers_with_retry_after(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::RETRY_AFTER,
            HeaderValue::from_str(value).expect("header value"),
        );
        headers
    }

    /// The decision after attempt `attempts`, at the call's start.
    fn decide_at_start(
        policy: &RetryPolicy,
        retryable: bool,
        attempts: u32,
        outcome: AttemptOutcome<'_>,
    ) -> Decision {
        policy.decide(
            retryable,
            attempts,
            outcome,
            Duration::ZERO,
            SystemTime::now(),
        )
    }

    fn answer(status: u16, headers: &HeaderMap) -> AttemptOutcome<'_> {
        AttemptOutcome::Answer {
            status: StatusCode::from_u16(status).expect("status"),
            headers,
        }
    }

    #[test]
    fn only_in_progress_throttled_and_unavailable_answers_are_retried() {
        let policy = RetryPolicy::default();
        let none = HeaderMap::new();
        for status in 100..=599u16 {
            let decision = policy.decide(
                true,
                1,
                answer(status, &none),
                Duration::ZERO,
                SystemTime::now(),
            );
            let retried = matches!(decision, Decision::Retry { .. });
            assert_eq!(
                retried,
                [409, 429, 502, 503, 504].contains(&status),
                "{status}: {decision:?}"
            );
        }
    }

    #[test]
    fn a_request_that_may_not_be_repeated_is_sent_once() {
        let policy = RetryPolicy::default();
        let none = HeaderMap::new();
        assert!(!may_retry(&Method::POST, false));
        assert!(!may_retry(&Method::PATCH, false));
        assert!(may_retry(&Method::POST, true));
        assert!(may_retry(&Method::PUT, false));
        for outcome in [
            AttemptOutcome::NoAnswer,
            answer(503, &none),
            answer(409, &none),
        ] {
            assert_eq!(
                decide_at_start(&policy, false, 1, outcome),
                Decision::Stop(StopReason::NotRetryable)
            );
        }
        // Its final answer is still an answer.
        assert_eq!(
            decide_at_start(&policy, false, 1, answer(201, &none)),
            Decision::Stop(StopReason::Answered)
        );
    }

    #[test]
    fn the_attempt_budget_ends_the_call() {
        let policy = RetryPolicy::default().with_max_attempts(3);
        let none = HeaderMap::new();
        assert!(matches!(
            decide_at_start(&policy, true, 2, answer(503, &none)),
            Decision::Retry { .. }
        ));
        assert_eq!(
            decide_at_start(&policy, true, 3, answer(503, &none)),
            Decision::Stop(StopReason::AttemptsExhausted)
        );
    }

    #[test]
    fn an_http_date_retry_after_is_read_against_the_wall_clock() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let later = headers_with_retry_after("Wed, 21 Oct 2015 07:28:10 GMT");
        assert_eq!(retry_after(&later, now), Some(Duration::from_secs(10)));
        let past = headers_with_retry_after("Wed, 21 Oct 2015 07:27:00 GMT");
        assert_eq!(retry_after(&past, now), Some(Duration::ZERO));
        let obsolete_format = headers_with_retry_after("Wednesday, 21-Oct-15 07:28:10 GMT");
        assert_eq!(
            retry_after(&obsolete_format, now),
            Some(Duration::from_secs(10))
        );
        let huge = headers_with_retry_after("99999999999999999999999");
        assert_eq!(retry_after(&huge, now), Some(Duration::from_secs(u64::MAX)));
        for malformed in ["", "-1", "1.5", "tomorrow"] {
            assert_eq!(
                retry_after(&headers_with_retry_after(malformed), now),
                None,
                "{malformed:?}"
            );
        }
        let policy = RetryPolicy::default().with_max_retry_after(Duration::from_secs(5));
        assert_eq!(
            policy.decide(true, 1, answer(429, &later), Duration::ZERO, now),
            Decision::Retry {
                delay: Duration::from_secs(5),
                asked_by_server: true
            }
        );
    }
}
