//! Metrics through the [`metrics`](https://docs.rs/metrics) facade: what the engine
//! counts and times, under which names and labels.
//!
//! The engine records into whatever recorder the application installed (Prometheus,
//! StatsD, OpenTelemetry, … through the `metrics-exporter-*` crates); without one, every
//! call is a no-op. The library installs nothing itself.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | [`REQUESTS_TOTAL`] `idempotent_requests_total` | counter | `handler`, `outcome` ([`Outcome`]) |
//! | [`STORE_OPERATION_DURATION`] `idempotent_store_operation_duration_seconds` | histogram | `operation` ([`StoreOperation`]), `result` (`ok` / `error`) |
//! | [`HANDLER_DURATION`] `idempotent_handler_duration_seconds` | histogram | `handler` |
//! | [`WAITS_TOTAL`] `idempotent_waits_total` | counter | `handler`, `result` |
//! | [`WAIT_DURATION`] `idempotent_wait_duration_seconds` | histogram | `handler` |
//! | [`STEPS_TOTAL`] `idempotent_steps_total` | counter | `handler`, `outcome` (`recorded` / `resumed`) |
//!
//! `handler` is the handler's name: `module::function` for an `#[idempotent]` handler,
//! what [`IdempotencyLayer::name`](crate::layer::IdempotencyLayer::name) or
//! [`HandlerConfig::name`](crate::config::HandlerConfig::name) set, or [`UNNAMED`]. One
//! exception: an `#[idempotent]` handler refuses a missing or malformed key in an
//! extractor, before its name is in reach, so its `key_missing` and `key_invalid` carry
//! the route instead (`/payments`, axum's `MatchedPath`), or [`UNNAMED`] outside a
//! router. Labels never carry a key or a scope: their number stays that of your routes.
//!
//! Call [`describe`] once after installing the recorder to give each metric its help
//! text and unit (building an [`Idempotency`](crate::engine::Idempotency) does it too).

use std::future::Future;
use std::time::Duration;

use crate::store::StoreError;

mod keys;

/// Counter: requests by `handler` and `outcome` (an [`Outcome`]'s
/// [`as_str`](Outcome::as_str)).
pub const REQUESTS_TOTAL: &str = "idempotent_requests_total";

/// Histogram (seconds): one store operation, by `operation` (a [`StoreOperation`]'s
/// [`as_str`](StoreOperation::as_str)) and `result` (`ok`, or `error` for a failure or a
/// timeout; an operation that answered "not yours any more" is `ok`).
pub const STORE_OPERATION_DURATION: &str = "idempotent_store_operation_duration_seconds";

/// Histogram (seconds): one run of a handler on a claimed key, by `handler` — from the
/// handler's start to its answer, the response body read whole (or cut at the
/// stored-response cap); a transactional handler's `BEGIN` and `COMMIT` excluded.
pub const HANDLER_DURATION: &str = "idempotent_handler_duration_seconds";

/// Counter: duplicates that waited for a running original ([`HandlerConfig::wait`]), by
/// `handler` and `result`: `replayed`, `ran` (the original released its claim and this
/// request ran the handler), `mismatch`, `failed` (the store failed) or `in_progress`
/// (still running at the end of the wait: `409`). The request also counts once in
/// [`REQUESTS_TOTAL`] under the outcome it ended in.
///
/// [`HandlerConfig::wait`]: crate::config::HandlerConfig::wait
pub const WAITS_TOTAL: &str = "idempotent_waits_total";

/// Histogram (seconds): how long a duplicate waited, by `handler`.
pub const WAIT_DURATION: &str = "idempotent_wait_duration_seconds";

/// Counter: steps of a multi-step handler ([`IdempotencyKey::step`]), by `handler` and
/// `outcome`: `recorded` (the step ran and its output was recorded) or `resumed` (an
/// earlier execution of the request recorded it; this one got its output back without
/// running it).
///
/// [`IdempotencyKey::step`]: crate::IdempotencyKey::step
pub const STEPS_TOTAL: &str = "idempotent_steps_total";

/// The `handler` label of a handler without a name.
pub const UNNAMED: &str = "unnamed";

/// Defines a label enum whose variants each map to one label value, in one line each.
macro_rules! label_values {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$doc:meta])* $variant:ident => $value:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        $vis enum $name {
            $( $(#[$doc])* $variant, )*
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &[$name] = &[$( $name::$variant, )*];

            /// The label value.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $value, )*
                }
            }
        }
    };
}

label_values! {
    /// The `outcome` label of [`REQUESTS_TOTAL`]. Each request counts once under each
    /// outcome it goes through: a handler that answers 5xx counts as `claimed` and
    /// `released`; one whose response needed a second try at recording as `claimed` and
    /// `completion_retried`.
    pub enum Outcome {
        /// The key was claimed and the handler ran (a fresh key, an expired record or a
        /// lease taken over).
        Claimed => "claimed",
        /// A stored response was replayed.
        Replayed => "replayed",
        /// A duplicate of a request still running: `409`.
        InProgress => "in_progress",
        /// The key was reused with another request: `422`.
        Mismatch => "mismatch",
        /// The claim was released so that a retry runs the handler again: a 5xx under
        /// `OnServerError::Release`, a panic, a transactional handler's `Err`, timeout
        /// or aborted transaction, an extractor's rejection behind the layer.
        Released => "released",
        /// No `Idempotency-Key` header: `400`.
        KeyMissing => "key_missing",
        /// A malformed `Idempotency-Key` header: `400`.
        KeyInvalid => "key_invalid",
        /// The store failed or timed out: `503` (before the handler ran, or for a
        /// transactional handler whose transaction could not begin or record).
        StoreError => "store_error",
        /// A running request lost its lease: no renewal succeeded for a whole lease, or
        /// the key was taken over before its outcome was recorded.
        LeaseLost => "lease_lost",
        /// Recording the response failed at first and was retried (inline, then in the
        /// background within the completion retry window).
        CompletionRetried => "completion_retried",
        /// Recording the response was still failing past the completion retry window
        /// while the lease still held: the engine keeps trying (until the lease is lost
        /// or the record's TTL ends) rather than let the lease lapse under it.
        CompletionOverdue => "completion_overdue",
        /// The claim's answer came too late in its lease to run the handler (a slow or
        /// stalled store): released, `503`, nothing ran.
        ClaimLate => "claim_late",
        /// `key = optional` without a key: the handler ran unprotected.
        Unprotected => "unprotected",
    }
}

label_values! {
    /// The `operation` label of [`STORE_OPERATION_DURATION`]: the [`Store`](crate::store::Store)
    /// method timed.
    pub enum StoreOperation {
        /// `claim`.
        Claim => "claim",
        /// `renew` (the heartbeat).
        Renew => "renew",
        /// `complete`, or a transactional handler's `complete_in`.
        Complete => "complete",
        /// `release`.
        Release => "release",
        /// `record_step`, or an atomic step's `record_step_in`.
        RecordStep => "record_step",
        /// One batch of `purge_expired`.
        Purge => "purge",
    }
}

/// Gives every metric its help text and unit in the installed recorder. Call it after
/// installing the recorder; calling it again is harmless.
pub fn describe() {
    ::metrics::describe_counter!(
        REQUESTS_TOTAL,
        ::metrics::Unit::Count,
        "Idempotent requests by handler and outcome"
    );
    ::metrics::describe_histogram!(
        STORE_OPERATION_DURATION,
        ::metrics::Unit::Seconds,
        "Idempotency store operations by operation and result"
    );
    ::metrics::describe_counter!(
        WAITS_TOTAL,
        ::metrics::Unit::Count,
        "Duplicates that waited for a running original, by handler and result"
    );
    ::metrics::describe_histogram!(
        WAIT_DURATION,
        ::metrics::Unit::Seconds,
        "How long duplicates waited for a running original"
    );
    ::metrics::describe_counter!(
        STEPS_TOTAL,
        ::metrics::Unit::Count,
        "Steps of multi-step handlers, recorded or resumed"
    );
    ::metrics::describe_histogram!(
        HANDLER_DURATION,
        ::metrics::Unit::Seconds,
        "Handler runs on a claimed idempotency key"
    );
}

impl Outcome {
    /// What a refused key counts as.
    pub(crate) fn of_key_error(err: &crate::key::KeyError) -> Self {
        match err {
            crate::key::KeyError::Missing => Self::KeyMissing,
            _ => Self::KeyInvalid,
        }
    }
}

/// Counts one request of `handler` under `outcome`.
pub(crate) fn count(handler: Option<&'static str>, outcome: Outcome) {
    let key = keys::of_handler(REQUESTS_TOTAL, handler, Some(("outcome", outcome.as_str())));
    keys::counter(key).increment(1);
}

/// Counts one request under `outcome`, labelled `handler` as given: a route, for the
/// attribute's key errors (not a `&'static str`, so its key is built on each call).
pub(crate) fn count_labelled(handler: impl Into<::metrics::SharedString>, outcome: Outcome) {
    ::metrics::counter!(REQUESTS_TOTAL, "handler" => handler.into(), "outcome" => outcome.as_str())
        .increment(1);
}

/// Counts one wait of `handler` that ended in `result`, and how long it took.
pub(crate) fn waited(handler: Option<&'static str>, result: &'static str, took: Duration) {
    let key = keys::of_handler(WAITS_TOTAL, handler, Some(("result", result)));
    keys::counter(key).increment(1);
    let key = keys::of_handler(WAIT_DURATION, handler, None);
    keys::histogram(key).record(took.as_secs_f64());
}

/// Counts one step of `handler` that ended `outcome` (`recorded` or `resumed`).
pub(crate) fn step(handler: Option<&'static str>, outcome: &'static str) {
    let key = keys::of_handler(STEPS_TOTAL, handler, Some(("outcome", outcome)));
    keys::counter(key).increment(1);
}

/// Records how long one handler run took.
pub(crate) fn handler_duration(handler: Option<&'static str>, took: Duration) {
    let key = keys::of_handler(HANDLER_DURATION, handler, None);
    keys::histogram(key).record(took.as_secs_f64());
}

/// Runs the store operation `operation`, recording how long it took and whether it failed.
/// A future dropped before it finished (a renewal abandoned at the lease's end) records
/// nothing.
pub(crate) async fn timed<T>(
    operation: StoreOperation,
    future: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let started = std::time::Instant::now();
    let result = future.await;
    store_operation(operation, result.is_ok(), started.elapsed());
    result
}

/// Records how long one store operation took and whether it failed.
pub(crate) fn store_operation(operation: StoreOperation, ok: bool, took: Duration) {
    let key = keys::of_store_operation(operation, ok);
    keys::histogram(key).record(took.as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_distinct_snake_case() {
        let outcomes: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        let operations: Vec<&str> = StoreOperation::ALL.iter().map(|o| o.as_str()).collect();
        for values in [&outcomes, &operations] {
            let mut unique = values.to_vec();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), values.len(), "{values:?}");
            for value in values {
                assert!(
                    value.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                    "{value}"
                );
            }
        }
        assert_eq!(outcomes.len(), 13);
    }
}
