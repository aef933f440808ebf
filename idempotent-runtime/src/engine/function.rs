//! The typed entry point: an async function run once per (scope, key, fingerprint), its
//! output serialised into the record and deserialised for every duplicate.
//!
//! It goes through the same [`protocol`](super::protocol) as an HTTP request: the same
//! claim, replay cache, waiting, takeover, heartbeat, steps and recording. What differs
//! is only how it is worded: [`Outcome`] instead of a `Response` (see [`Door`]), and how
//! a function's result is judged ([`Judge`]): `Ok` is recorded, `Err` releases the claim.
//!
//! The record of an output is a stored response with status `200`, a
//! `content-type: application/json` header and the output's JSON as its body, so every
//! store keeps it as it keeps an HTTP answer.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{Instrument, error, info_span, warn};

use super::Inner;
use super::execution::Execution;
use super::protocol;
use super::record::{Captured, GiveUp, Verdict};
use super::settlement::{Door, Judge, Settlement};
use crate::config::HandlerConfig;
use crate::fingerprint::RequestFingerprint;
use crate::key::IdempotencyKey;
use crate::store::StoredResponse;
#[cfg(feature = "sql")]
use crate::transaction::{Tx, TxDatabase};

/// The status an output's record carries: what tells it apart from a record this entry
/// point did not write (an HTTP handler's, or an interrupted run's problem).
const OUTPUT_STATUS: u16 = 200;

/// What [`Idempotency::once`](super::Idempotency::once) (and
/// [`once_in_transaction`](super::Idempotency::once_in_transaction)) came to for one call.
///
/// Which variants settle the call (nothing more to do), and which say "try again later":
///
/// | variant | the function | retry? |
/// |---|---|---|
/// | [`Ran`](Self::Ran) | ran now; its output is recorded | no |
/// | [`Replayed`](Self::Replayed) | ran earlier; this is its recorded output | no |
/// | [`RanUnrecorded`](Self::RanUnrecorded) | ran now; its record is not confirmed yet | later, with the same key (replays once recorded) |
/// | [`Failed`](Self::Failed) | ran and failed, or was stopped; the claim was released | yes: it runs again |
/// | [`InProgress`](Self::InProgress) | runs elsewhere now | after `retry_after` |
/// | [`StoreUnavailable`](Self::StoreUnavailable) | did not run | yes, later |
/// | [`KeyReused`](Self::KeyReused) | did not run: the key belongs to another payload | no: a new key |
/// | [`Interrupted`](Self::Interrupted) | ran past its maximum duration; may or may not have taken effect; never runs again under the key | no |
/// | [`Unreadable`](Self::Unreadable) | ran earlier, but its record holds no output of type `T` | no |
/// | [`Refused`](Self::Refused) | did not run: the call is misconfigured | not until fixed |
///
/// A *permanent* failure the caller wants every duplicate to get (a declined card, an
/// invalid command) is an output like any other: make `T` say it (e.g.
/// `Result<Receipt, Declined>`, serialisable) and return it in `Ok`. The function's
/// `Err` means "not done": it is never recorded, so that a redelivery runs the function
/// again — which is what a transient failure needs, and why `E` need not be
/// serialisable.
///
/// ```
/// use std::time::Duration;
///
/// use idempotent_runtime::Outcome;
/// use idempotent_runtime::engine::Failure;
///
/// /// What a job runner logs for one call.
/// fn describe(outcome: &Outcome<u64, String>) -> String {
///     match outcome {
///         Outcome::Ran(cents) | Outcome::Replayed(cents) => format!("charged {cents}"),
///         Outcome::RanUnrecorded(_) => "charged; record pending".to_owned(),
///         Outcome::Failed(Failure::Error(error)) => format!("failed: {error}; will retry"),
///         Outcome::Failed(other) => format!("{other}; will retry"),
///         Outcome::InProgress { retry_after } => format!("running; retry in {retry_after:?}"),
///         Outcome::StoreUnavailable(unavailable) => unavailable.to_string(),
///         Outcome::KeyReused => "the id was used for another payload".to_owned(),
///         Outcome::Interrupted => "interrupted; check the effect".to_owned(),
///         Outcome::Unreadable(why) => why.to_string(),
///         Outcome::Refused(why) => why.to_string(),
///         _ => "unknown".to_owned(),
///     }
/// }
///
/// assert_eq!(describe(&Outcome::Replayed(1999)), "charged 1999");
/// let running = Outcome::InProgress { retry_after: Duration::from_secs(3) };
/// assert_eq!(describe(&running), "running; retry in 3s");
/// ```
#[derive(Debug)]
#[must_use]
#[non_exhaustive]
pub enum Outcome<T, E> {
    /// The function ran and returned `T`; its record is committed (with a transactional
    /// function's writes).
    Ran(T),
    /// The function ran and returned `T`, but the engine could not confirm its record
    /// before answering: the store failed after the run (the engine keeps trying in the
    /// background while the lease holds), or the claim was taken over meanwhile. A
    /// duplicate later replays it, finds it in progress, or — if it is never recorded —
    /// runs the function again: a consumer should not acknowledge its message yet.
    RanUnrecorded(T),
    /// The function ran earlier for this key and payload: its recorded output.
    Replayed(T),
    /// The function did not complete; the claim was released (its recorded steps kept),
    /// so the next call with the key runs it again.
    Failed(Failure<E>),
    /// Another call with the key is running; its lease runs out in at most `retry_after`.
    InProgress {
        /// When to try again: the store's time left on the holder's lease (at least a
        /// second), or less, from how long the function usually takes.
        retry_after: Duration,
    },
    /// The key was used for another payload (another fingerprint): nothing ran.
    KeyReused,
    /// The store could not be reached: nothing ran (a transactional function's writes
    /// rolled back), and the claim, if taken, was released.
    StoreUnavailable(StoreUnavailable),
    /// The function ran past its maximum duration: it may or may not have taken effect,
    /// and that is recorded, so it never runs again under this key.
    Interrupted,
    /// A record for the key and payload exists, but it holds no output of type `T` (it
    /// was not kept, or was written by another door or for another type): the function
    /// is not run again.
    Unreadable(Unreadable),
    /// The call is misconfigured and nothing ran.
    Refused(Refused),
}

impl<T, E> Outcome<T, E> {
    /// The function's output, when it ran (now or earlier): [`Ran`](Self::Ran),
    /// [`RanUnrecorded`](Self::RanUnrecorded) or [`Replayed`](Self::Replayed).
    pub fn output(self) -> Option<T> {
        match self {
            Self::Ran(output) | Self::RanUnrecorded(output) | Self::Replayed(output) => {
                Some(output)
            }
            _ => None,
        }
    }

    /// What a message consumer does with the message that carried this call.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use idempotent_runtime::Outcome;
    /// use idempotent_runtime::engine::Disposition;
    ///
    /// let running: Outcome<u8, ()> = Outcome::InProgress { retry_after: Duration::from_secs(7) };
    /// assert_eq!(running.disposition(), Disposition::Redeliver(Some(Duration::from_secs(7))));
    /// assert_eq!(Outcome::<u8, ()>::Replayed(1).disposition(), Disposition::Acknowledge);
    /// assert_eq!(Outcome::<u8, ()>::KeyReused.disposition(), Disposition::Reject);
    /// ```
    pub fn disposition(&self) -> Disposition {
        match self {
            Self::Ran(_) | Self::Replayed(_) | Self::Interrupted | Self::Unreadable(_) => {
                Disposition::Acknowledge
            }
            Self::InProgress { retry_after } => Disposition::Redeliver(Some(*retry_after)),
            Self::RanUnrecorded(_)
            | Self::Failed(_)
            | Self::StoreUnavailable(_)
            | Self::Refused(_) => Disposition::Redeliver(None),
            Self::KeyReused => Disposition::Reject,
        }
    }

    /// Whether the call is settled for good under its key: [`Ran`](Self::Ran),
    /// [`Replayed`](Self::Replayed), [`Interrupted`](Self::Interrupted),
    /// [`Unreadable`](Self::Unreadable) or [`KeyReused`](Self::KeyReused) — running it
    /// again would change nothing. A consumer acknowledges its message then.
    pub fn is_settled(&self) -> bool {
        matches!(
            self,
            Self::Ran(_)
                | Self::Replayed(_)
                | Self::Interrupted
                | Self::Unreadable(_)
                | Self::KeyReused
        )
    }
}

/// What a message consumer does with the message whose call came to an [`Outcome`]
/// ([`Outcome::disposition`]): the one rule every queue door follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Settled for good: acknowledge the message. Only once the record is committed
    /// (ran, replayed) or the key can never run again (interrupted, unreadable).
    Acknowledge,
    /// Not done: have the message delivered again after this long (`None`: the door's
    /// own retry delay) — a duplicate of a running call (after the time left on its
    /// lease), a failure that released the claim, a store outage, a record not
    /// confirmed yet, a misconfiguration.
    Redeliver(Option<Duration>),
    /// It can never run under its id (the id was used for another payload): reject it
    /// (dead-letter it, where the door can) rather than have it redelivered forever.
    Reject,
}

/// Why a function did not complete ([`Outcome::Failed`]); in every case its claim was
/// released, so the next call runs it again.
#[derive(Debug)]
#[non_exhaustive]
pub enum Failure<E> {
    /// The function returned this error (a transactional function's writes rolled back).
    Error(E),
    /// The function panicked.
    Panicked,
    /// A transactional function ran past its maximum duration; its writes rolled back.
    TimedOut,
    /// A transactional function's transaction failed in the database (a statement failed
    /// and left it aborted, or COMMIT refused it); nothing was written.
    TransactionAborted,
    /// A transactional function's claim was taken over before it could commit; its
    /// writes rolled back.
    LeaseLost,
    /// The call was cut off outside the function (a panic in the engine, or the runtime
    /// shutting down).
    Interrupted,
}

impl<E: fmt::Display> fmt::Display for Failure<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Error(error) => write!(f, "the function returned an error: {error}"),
            Self::Panicked => f.write_str("the function panicked"),
            Self::TimedOut => f.write_str("the function ran past its maximum duration"),
            Self::TransactionAborted => f.write_str("the function's transaction was aborted"),
            Self::LeaseLost => f.write_str("the claim was taken over before the commit"),
            Self::Interrupted => f.write_str("the call was interrupted outside the function"),
        }
    }
}

/// The store could not be reached ([`Outcome::StoreUnavailable`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreUnavailable {
    doing: &'static str,
}

impl StoreUnavailable {
    /// What the engine was doing when the store failed (e.g. `"claiming the key"`).
    pub fn doing(&self) -> &'static str {
        self.doing
    }
}

impl fmt::Display for StoreUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "idempotency store unavailable while {}", self.doing)
    }
}

impl std::error::Error for StoreUnavailable {}

/// Why a record holds no output ([`Outcome::Unreadable`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unreadable {
    /// The output was not kept: its JSON was larger than the engine keeps
    /// ([`IdempotencyBuilder::max_stored_body`](super::IdempotencyBuilder::max_stored_body)),
    /// or it could not be serialised.
    NotKept,
    /// The record is not one of this entry point's outputs: an HTTP handler's answer
    /// under the same scope and key, or the interrupted record of a run past its maximum
    /// duration. Its status.
    NotAnOutput(u16),
    /// The recorded JSON does not deserialise as `T` (the type changed since): serde's
    /// message.
    Undecodable(String),
}

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotKept => f.write_str("the recorded output was not kept"),
            Self::NotAnOutput(status) => write!(
                f,
                "the record is not a function's output (recorded status {status})"
            ),
            Self::Undecodable(error) => write!(f, "the recorded output does not decode: {error}"),
        }
    }
}

/// Why a call was refused without running ([`Outcome::Refused`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refused {
    /// The scope was empty: one key space for every caller would replay one caller's
    /// output to another.
    ScopeEmpty,
    /// A transactional function on an engine whose store is not of its database (named).
    TransactionUnsupported(&'static str),
    /// The payload an `#[idempotent(key = …)]` function is fingerprinted by did not
    /// serialise to JSON (serde's message): without a fingerprint the engine could not
    /// tell a duplicate from another payload under the same key.
    PayloadUnserialisable(String),
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ScopeEmpty => f.write_str("the idempotency scope is empty"),
            Self::TransactionUnsupported(database) => write!(
                f,
                "a {database} transaction was asked of an engine whose store is not a {database} store"
            ),
            Self::PayloadUnserialisable(error) => {
                write!(f, "the payload does not serialise to JSON: {error}")
            }
        }
    }
}

impl<T, E> Door for Outcome<T, E>
where
    T: DeserializeOwned + Send + 'static,
    E: Send + 'static,
{
    fn settle(settlement: Settlement) -> Self {
        match settlement {
            Settlement::Replayed(replay) => read_output(replay.into_stored()),
            Settlement::KeyReused => Self::KeyReused,
            Settlement::InProgress(retry_after) => Self::InProgress { retry_after },
            Settlement::StoreUnavailable(doing) => {
                Self::StoreUnavailable(StoreUnavailable { doing })
            }
            Settlement::ScopeEmpty => Self::Refused(Refused::ScopeEmpty),
            Settlement::AttemptInterrupted => Self::Failed(Failure::Interrupted),
            Settlement::Panicked => Self::Failed(Failure::Panicked),
            Settlement::Interrupted(_) => Self::Interrupted,
            #[cfg(feature = "sql")]
            Settlement::TransactionUnsupported(database) => {
                Self::Refused(Refused::TransactionUnsupported(database))
            }
            #[cfg(feature = "sql")]
            Settlement::TransactionAborted => Self::Failed(Failure::TransactionAborted),
            #[cfg(feature = "sql")]
            Settlement::LeaseLost => Self::Failed(Failure::LeaseLost),
            #[cfg(feature = "sql")]
            Settlement::TimedOut => Self::Failed(Failure::TimedOut),
        }
    }

    fn record_pending(self) -> Self {
        match self {
            Self::Ran(output) => Self::RanUnrecorded(output),
            other => other,
        }
    }
}

/// A function's result, for the protocol to judge: `Ok` is recorded, `Err` releases.
pub(super) struct Typed<T, E>(Result<T, E>);

impl<T, E> Judge for Typed<T, E>
where
    T: Serialize + DeserializeOwned + Send + 'static,
    E: Send + 'static,
{
    type Answer = Outcome<T, E>;

    async fn judge(self, execution: &Execution) -> Verdict<Outcome<T, E>> {
        match self.0 {
            Ok(output) => Verdict::Record(Captured {
                stored: output_record(&output, execution.inner.max_stored_body),
                answer: Outcome::Ran(output),
            }),
            Err(error) => Verdict::GiveUp(
                GiveUp::FunctionError,
                Outcome::Failed(Failure::Error(error)),
            ),
        }
    }
}

/// The record of `output`: its JSON, or no body when it does not fit `cap` or does not
/// serialise (the function ran: its record must still keep the key from running again).
fn output_record<T: Serialize>(output: &T, cap: usize) -> StoredResponse {
    let body = match serde_json::to_vec(output) {
        Ok(json) if json.len() <= cap => Some(Bytes::from(json)),
        Ok(json) => {
            warn!(
                event = "completed",
                reason = "over_cap",
                cap,
                len = json.len(),
                "the function's output is larger than the store keeps; recorded without it"
            );
            None
        }
        Err(err) => {
            error!(
                event = "completed",
                reason = "unserialisable",
                error = %err,
                "the function's output does not serialise; recorded without it"
            );
            None
        }
    };
    StoredResponse {
        status: OUTPUT_STATUS,
        headers: vec![(
            http::header::CONTENT_TYPE.as_str().to_owned(),
            b"application/json".to_vec(),
        )],
        body,
    }
}

/// A replayed record as an outcome: its output, or why it holds none.
fn read_output<T: DeserializeOwned, E>(stored: StoredResponse) -> Outcome<T, E> {
    if stored.status != OUTPUT_STATUS {
        return Outcome::Unreadable(Unreadable::NotAnOutput(stored.status));
    }
    let Some(body) = stored.body else {
        return Outcome::Unreadable(Unreadable::NotKept);
    };
    match serde_json::from_slice(&body) {
        Ok(output) => Outcome::Replayed(output),
        Err(err) => Outcome::Unreadable(Unreadable::Undecodable(err.to_string())),
    }
}

/// A plain function's call (see [`Idempotency::once`](super::Idempotency::once)).
pub(super) async fn once<F, Fut, T, E>(
    inner: &Arc<Inner>,
    config: &HandlerConfig,
    scope: &str,
    key: &str,
    request: RequestFingerprint,
    function: F,
) -> Outcome<T, E>
where
    F: FnOnce(IdempotencyKey) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    T: Serialize + DeserializeOwned + Send + 'static,
    E: Send + 'static,
{
    let span = info_span!("idempotent", scope = %scope, key = %key, door = "function");
    protocol::handle(inner, config, scope, key, request, |execution, key| {
        // Boxed, as the HTTP door's handler: the engine's layers move a pointer.
        protocol::execute(
            execution,
            Box::pin(async move { Typed(function(key).await) }),
        )
    })
    .instrument(span)
    .await
}

/// A transactional function's call (see
/// [`Idempotency::once_in_transaction`](super::Idempotency::once_in_transaction)).
#[cfg(feature = "sql")]
pub(super) async fn once_in_transaction<DB, F, Fut, T, E>(
    inner: &Arc<Inner>,
    config: &HandlerConfig,
    scope: &str,
    key: &str,
    request: RequestFingerprint,
    function: F,
) -> Outcome<T, E>
where
    DB: TxDatabase,
    F: FnOnce(IdempotencyKey, Tx<DB>) -> Fut + Send + 'static,
    Fut: Future<Output = (Result<T, E>, Tx<DB>)> + Send + 'static,
    T: Serialize + DeserializeOwned + Send + 'static,
    E: Send + 'static,
{
    let span = info_span!(
        "idempotent",
        scope = %scope,
        key = %key,
        door = "function",
        transactional = true
    );
    async move {
        let Some(tx_store) = protocol::tx_store::<DB>(&inner.capabilities) else {
            error!(
                event = "store_error",
                database = DB::DATABASE_NAME,
                "transactional function on an engine whose store is not of its database"
            );
            return Outcome::settle(Settlement::TransactionUnsupported(DB::DATABASE_NAME));
        };
        let function = move |key, tx| async move {
            let (result, tx) = function(key, tx).await;
            (Typed(result), tx)
        };
        protocol::handle(inner, config, scope, key, request, |execution, key| {
            protocol::execute_in_transaction(execution, tx_store, key, function)
        })
        .await
    }
    .instrument(span)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    type O = Outcome<u8, &'static str>;

    #[test]
    fn every_outcome_has_its_disposition() {
        let secs = Duration::from_secs;
        let cases: Vec<(O, Disposition, bool)> = vec![
            (Outcome::Ran(1), Disposition::Acknowledge, true),
            (Outcome::Replayed(1), Disposition::Acknowledge, true),
            (Outcome::Interrupted, Disposition::Acknowledge, true),
            (
                Outcome::Unreadable(Unreadable::NotKept),
                Disposition::Acknowledge,
                true,
            ),
            (Outcome::KeyReused, Disposition::Reject, true),
            (
                Outcome::InProgress {
                    retry_after: secs(4),
                },
                Disposition::Redeliver(Some(secs(4))),
                false,
            ),
            (
                Outcome::RanUnrecorded(1),
                Disposition::Redeliver(None),
                false,
            ),
            (
                Outcome::Failed(Failure::Error("timeout")),
                Disposition::Redeliver(None),
                false,
            ),
            (
                Outcome::StoreUnavailable(StoreUnavailable {
                    doing: "claiming the key",
                }),
                Disposition::Redeliver(None),
                false,
            ),
            (
                Outcome::Refused(Refused::ScopeEmpty),
                Disposition::Redeliver(None),
                false,
            ),
        ];
        for (outcome, disposition, settled) in cases {
            assert_eq!(outcome.disposition(), disposition, "{outcome:?}");
            assert_eq!(outcome.is_settled(), settled, "{outcome:?}");
        }
    }

    #[test]
    fn an_output_round_trips_through_its_record_and_nothing_else_reads_as_one() {
        let stored = output_record(&vec![1u32, 2, 3], 1024);
        assert_eq!(stored.status, OUTPUT_STATUS);
        assert!(matches!(
            read_output::<Vec<u32>, ()>(stored.clone()),
            Outcome::Replayed(v) if v == [1, 2, 3]
        ));
        assert!(matches!(
            read_output::<String, ()>(stored),
            Outcome::Unreadable(Unreadable::Undecodable(_))
        ));
        let over_cap = output_record(&"x".repeat(100), 10);
        assert!(over_cap.body.is_none());
        assert!(matches!(
            read_output::<String, ()>(over_cap),
            Outcome::Unreadable(Unreadable::NotKept)
        ));
        let http = StoredResponse {
            status: 201,
            headers: Vec::new(),
            body: Some(Bytes::from_static(b"\"created\"")),
        };
        assert!(matches!(
            read_output::<String, ()>(http),
            Outcome::Unreadable(Unreadable::NotAnOutput(201))
        ));
    }
}
