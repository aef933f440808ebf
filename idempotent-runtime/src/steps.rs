//! Recovery points: named steps inside an idempotent handler, each run once per request.
//!
//! A payment handler is rarely one call: it authorises at the gateway, writes the ledger,
//! sends a receipt. [`IdempotencyKey::step`](crate::IdempotencyKey::step) runs one such
//! step and records its output with the key's record; a later execution of the same
//! request (a retry after a crash, a lost lease, or a released `5xx`) gets the recorded
//! output back instead of running the step again, and so resumes where the last run
//! stopped. [`IdempotencyKey::atomic_step`](crate::IdempotencyKey::atomic_step) runs a
//! step whose writes go to the store's own database in one transaction with its record:
//! exactly once.
//!
//! The guide's chapter [Multi-step handlers](crate::guide::steps) explains when to
//! use which, and what a retry does after each kind of failure.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::StatusCode;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use crate::lease::LeaseSignal;
use crate::metrics::{self, StoreOperation};
use crate::problem::{Problem, codes};
#[cfg(feature = "sql")]
use crate::store::TxSupport;
use crate::store::{FencingToken, MAX_STEP_NAME, RecordedStep, Store, StoreError};
#[cfg(feature = "sql")]
use crate::transaction::{Tx, TxDatabase};

/// What the engine does with the claim after a step failed, whatever the handler's
/// `on_server_error` and whatever response it made of the [`StepError`] (its own error
/// type included): the [`StepLog`] keeps it, and the engine reads it from there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum StepAnswer {
    /// Record the handler's answer: the step ran, but its output can never be recorded
    /// (too large, not serialisable), so a retry would only run it again and fail the
    /// same way.
    Record,
    /// Give the claim up when the handler answers an error (`4xx`, `5xx`), keeping the
    /// recorded steps, so a retry resumes: the lease was lost or the store failed
    /// (recording its `503` would replay it for the whole TTL); a handler that carried on
    /// and answered a success is recorded. Overrides [`Record`](Self::Record).
    Release,
}

impl StepAnswer {
    /// What a step that failed with `error` asks of the claim; `None`: nothing beyond
    /// the handler's `on_server_error` (the step's own failure, a misuse).
    fn of<E>(error: &StepError<E>) -> Option<Self> {
        match error {
            StepError::LeaseLost { .. }
            | StepError::Store { .. }
            | StepError::OutcomeUnknown { .. } => Some(Self::Release),
            StepError::TooLarge { .. } | StepError::Unserialisable { .. } => Some(Self::Record),
            _ => None,
        }
    }
}

/// Why a step did not give its output.
///
/// Answer it from a handler with `?` into your own error type, or return it: as a
/// response ([`IntoResponse`]), [`Failed`](Self::Failed) answers the step's own error and
/// every other variant a problem+json `5xx`. A lost lease or a store failure (`503`)
/// gives the claim up, keeping the steps already recorded so a retry resumes after them,
/// whatever the handler's `on_server_error`; a step that ran but whose output cannot be
/// recorded ([`TooLarge`](Self::TooLarge), [`Unserialisable`](Self::Unserialisable))
/// records its `500`, so a retry replays it rather than run the step again; a misuse
/// (`500`) follows `on_server_error`.
#[derive(Debug)]
#[non_exhaustive]
pub enum StepError<E> {
    /// The step returned this error. Nothing was recorded: a retry runs the step again.
    Failed(E),
    /// This request no longer holds its key's lease (before the step started, or the
    /// store refused to record its output because another execution took the key over),
    /// so the step did not run, or its output belongs to no one. Answered `503`.
    LeaseLost {
        /// The step.
        step: String,
    },
    /// The store could not record the step's output, or could not begin or commit an
    /// atomic step's transaction. An external step did run: a retry runs it again
    /// (at-least-once; pass [`derive`](crate::IdempotencyKey::derive)`(step)` downstream).
    /// Answered `503`.
    Store {
        /// The step.
        step: String,
        /// What the store said.
        source: StoreError,
    },
    /// The handler called the same step name twice in one execution. Answered `500`.
    NameUsedTwice {
        /// The step.
        step: String,
    },
    /// The name is empty or longer than [`MAX_STEP_NAME`] bytes. Answered `500`.
    InvalidName {
        /// The step.
        step: String,
    },
    /// A recorded output no longer deserialises as the type the handler asks for (the
    /// code changed between the runs). The step is not run again. Answered `500`.
    Undecodable {
        /// The step.
        step: String,
        /// Why it does not deserialise.
        source: serde_json::Error,
    },
    /// The step's output does not serialise to JSON. Answered `500`.
    Unserialisable {
        /// The step.
        step: String,
        /// Why it does not serialise.
        source: serde_json::Error,
    },
    /// The step's serialised output is larger than the engine's stored-body cap
    /// (`IdempotencyBuilder::max_stored_body`). Answered `500`.
    TooLarge {
        /// The step.
        step: String,
        /// Its serialised length in bytes.
        len: usize,
        /// The cap.
        max: usize,
    },
    /// The key was not handed out by the engine for a claimed request (made with
    /// [`IdempotencyKey::new`](crate::IdempotencyKey::new), say): there is no record to
    /// keep the step in. Answered `500`.
    NotClaimed {
        /// The step.
        step: String,
    },
    /// A step inside a transactional handler (one that takes `Tx<DB>`), or called while
    /// an atomic step's transaction is open: the handler's writes already commit with its
    /// response, all or nothing, so there is nothing to resume; and a step's record would
    /// wait for the lock the open transaction holds. Answered `500`.
    InsideTransaction {
        /// The step.
        step: String,
    },
    /// An atomic step names a database the store does not keep its records in.
    /// Answered `500`.
    TransactionUnsupported {
        /// The step.
        step: String,
        /// The database the step asked for.
        database: &'static str,
    },
    /// An at-most-once step ([`step_at_most_once`](crate::IdempotencyKey::step_at_most_once))
    /// was started by an earlier execution, which did not record its outcome, and its
    /// `verify` could not tell whether the call took effect: the step is not called
    /// again. Answered `500` (`step_outcome_unknown`); the claim is given up with its
    /// steps kept, so every retry asks `verify` again until it can tell or an operator
    /// resolves the step ([`Idempotency::resolve_step`](crate::Idempotency::resolve_step))
    /// or forgets the key.
    OutcomeUnknown {
        /// The step.
        step: String,
    },
}

/// What an at-most-once step's `verify` found out about a call an earlier execution
/// made without recording its outcome (see
/// [`IdempotencyKey::step_at_most_once`](crate::IdempotencyKey::step_at_most_once)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified<T> {
    /// The call took effect, with this output: it is recorded, and the request resumes.
    Happened(T),
    /// The call never took effect: the step may call it now.
    NotHappened,
    /// No way to tell: the step fails closed ([`StepError::OutcomeUnknown`]).
    Unknown,
}

/// A `verify` for an at-most-once step that has no way to look a call up: a call whose
/// outcome was not recorded is never repeated, and needs an operator
/// ([`StepError::OutcomeUnknown`]).
pub async fn cannot_verify<T, E>() -> Result<Verified<T>, E> {
    Ok(Verified::Unknown)
}

impl<E> StepError<E> {
    /// The step's name, for every variant but [`Failed`](Self::Failed).
    pub fn step(&self) -> Option<&str> {
        match self {
            Self::Failed(_) => None,
            Self::LeaseLost { step }
            | Self::Store { step, .. }
            | Self::NameUsedTwice { step }
            | Self::InvalidName { step }
            | Self::Undecodable { step, .. }
            | Self::Unserialisable { step, .. }
            | Self::TooLarge { step, .. }
            | Self::NotClaimed { step }
            | Self::InsideTransaction { step }
            | Self::TransactionUnsupported { step, .. }
            | Self::OutcomeUnknown { step } => Some(step),
        }
    }

    /// The same error with the step's own error mapped by `f`.
    pub fn map_failed<F>(self, f: impl FnOnce(E) -> F) -> StepError<F> {
        match self {
            Self::Failed(error) => StepError::Failed(f(error)),
            Self::LeaseLost { step } => StepError::LeaseLost { step },
            Self::Store { step, source } => StepError::Store { step, source },
            Self::NameUsedTwice { step } => StepError::NameUsedTwice { step },
            Self::InvalidName { step } => StepError::InvalidName { step },
            Self::Undecodable { step, source } => StepError::Undecodable { step, source },
            Self::Unserialisable { step, source } => StepError::Unserialisable { step, source },
            Self::TooLarge { step, len, max } => StepError::TooLarge { step, len, max },
            Self::NotClaimed { step } => StepError::NotClaimed { step },
            Self::InsideTransaction { step } => StepError::InsideTransaction { step },
            Self::TransactionUnsupported { step, database } => {
                StepError::TransactionUnsupported { step, database }
            }
            Self::OutcomeUnknown { step } => StepError::OutcomeUnknown { step },
        }
    }
}

impl<E> StepError<E> {
    /// What went wrong, for every variant but [`Failed`](Self::Failed) (which needs its
    /// error displayed).
    fn reason(&self) -> Option<String> {
        Some(match self {
            Self::Failed(_) => return None,
            Self::LeaseLost { step } => format!("step {step:?}: this request lost its lease"),
            Self::Store { step, source } => format!("step {step:?}: {source}"),
            Self::NameUsedTwice { step } => {
                format!("step {step:?} is called twice in one execution")
            }
            Self::InvalidName { step } => {
                format!("step name {step:?} is empty or longer than {MAX_STEP_NAME} bytes")
            }
            Self::Undecodable { step, source } => {
                format!("step {step:?}: the recorded output does not deserialise: {source}")
            }
            Self::Unserialisable { step, source } => {
                format!("step {step:?}: the output does not serialise: {source}")
            }
            Self::TooLarge { step, len, max } => {
                format!("step {step:?}: the output is {len} bytes, over the {max}-byte cap")
            }
            Self::NotClaimed { step } => format!(
                "step {step:?}: the key was not handed out by the engine for a claimed request"
            ),
            Self::InsideTransaction { step } => format!(
                "step {step:?} is called inside a transactional handler, whose writes already \
                 commit with its response"
            ),
            Self::TransactionUnsupported { step, database } => {
                format!("step {step:?}: the idempotency store keeps no records in {database}")
            }
            Self::OutcomeUnknown { step } => format!(
                "step {step:?} was called by an earlier execution without recording its \
                 outcome, and its verify cannot tell whether it took effect"
            ),
        })
    }
}

impl<E: std::fmt::Display> std::fmt::Display for StepError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self, self.reason()) {
            (Self::Failed(error), _) => write!(f, "the step failed: {error}"),
            (_, reason) => f.write_str(&reason.unwrap_or_default()),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for StepError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Failed(error) => Some(error),
            Self::Store { source, .. } => Some(source),
            Self::Undecodable { source, .. } | Self::Unserialisable { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// [`Failed`](StepError::Failed) answers the step's own error; a lost lease or a store
/// failure `503` (retry with the same key: it resumes); a misuse `500`.
impl<E: IntoResponse> IntoResponse for StepError<E> {
    fn into_response(self) -> Response {
        let step = self.step().unwrap_or_default().to_owned();
        match self {
            Self::Failed(error) => error.into_response(),
            Self::LeaseLost { .. } => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                codes::LEASE_LOST,
                "Request lease lost",
                format!(
                    "This execution of the request lost its claim before step {step:?} \
                         finished; the completed steps are kept. Retry with the same key."
                ),
            )
            .with_retry_after(1)
            .into_response(),
            Self::Store { .. } => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                codes::STORE_UNAVAILABLE,
                "Idempotency store unavailable",
                format!(
                    "Step {step:?} could not be recorded; the completed steps are kept. \
                         Retry with the same key."
                ),
            )
            .with_retry_after(1)
            .into_response(),
            Self::OutcomeUnknown { .. } => {
                warn!(
                    event = "step_outcome_unknown",
                    step,
                    "an at-most-once step's earlier call has an unknown outcome; not calling it again"
                );
                Problem::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    codes::STEP_OUTCOME_UNKNOWN,
                    "Outcome unknown",
                    format!(
                        "Step {step:?} of this request may or may not have taken effect, and \
                         it is not repeated blindly. The operation needs to be checked; \
                         retrying with the same key repeats the check."
                    ),
                )
                .into_response()
            }
            ran @ (Self::TooLarge { .. } | Self::Unserialisable { .. }) => {
                let reason = ran.reason().unwrap_or_default();
                warn!(
                    event = "step_unrecordable",
                    step, reason, "step output cannot be recorded; recording the 500"
                );
                Problem::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    codes::STEP_FAILED,
                    "Internal server error",
                    "A step of the request ran, but its result could not be kept. The \
                     request is not run again under this key.",
                )
                .into_response()
            }
            other => {
                let reason = other.reason().unwrap_or_default();
                warn!(event = "step_invalid", step, reason, "step refused");
                Problem::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    codes::STEP_FAILED,
                    "Internal server error",
                    "A step of the request could not run; it is safe to retry with the same key.",
                )
                .into_response()
            }
        }
    }
}

/// The steps of one claimed execution: what the claim brought back, which names this run
/// used, and how to record more. The engine makes one per claim and hands it to the
/// handler inside its [`IdempotencyKey`](crate::IdempotencyKey).
pub(crate) struct StepLog {
    store: Arc<dyn Store>,
    /// The store's transactions, for atomic steps.
    #[cfg(feature = "sql")]
    transactions: Option<TxSupport>,
    token: FencingToken,
    /// The lease as the execution holds it: the log is what every holder of the
    /// execution (the engine, the heartbeat, the handler's key) shares, so the lease
    /// rides in its allocation.
    lease: LeaseSignal,
    /// The handler's name, for metrics.
    handler: Option<&'static str>,
    store_timeout: Duration,
    /// The largest serialised output recorded.
    max_output: usize,
    /// The handler runs in a transaction of its own: steps are refused.
    in_transaction: AtomicBool,
    /// An atomic step's transaction is open: other steps are refused until it ends (on
    /// SQLite their record would wait for the write lock it holds).
    atomic_open: AtomicBool,
    progress: Mutex<Progress>,
}

/// What the execution knows of its steps.
#[derive(Default)]
struct Progress {
    /// Recorded by earlier executions of the request, as the claim brought them back.
    recorded: Vec<RecordedStep>,
    /// The names this execution called, in order.
    used: Vec<String>,
    /// What the steps that failed ask of the claim, the strongest first.
    answer: Option<StepAnswer>,
}

impl std::fmt::Debug for StepLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("StepLog")
            .field("token", &self.token)
            .field(
                "recorded",
                &progress
                    .recorded
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("used", &progress.used)
            .finish_non_exhaustive()
    }
}

/// What the engine gives a [`StepLog`]: the claim and the engine's settings.
pub(crate) struct StepContext {
    pub(crate) store: Arc<dyn Store>,
    #[cfg(feature = "sql")]
    pub(crate) transactions: Option<TxSupport>,
    pub(crate) token: FencingToken,
    pub(crate) lease: LeaseSignal,
    pub(crate) handler: Option<&'static str>,
    pub(crate) store_timeout: Duration,
    pub(crate) max_output: usize,
}

/// Where a step stands before it runs.
enum Start {
    /// Recorded by an earlier execution: this output, not run again.
    Resume(Bytes),
    /// An at-most-once step an earlier execution called without recording its outcome
    /// (its intent is recorded, its output is not): verify before anything else.
    Verify,
    /// Not recorded yet: run it.
    Run,
}

impl StepLog {
    /// The log of a claim that brought back `recorded` steps.
    pub(crate) fn new(context: StepContext, recorded: Vec<RecordedStep>) -> Self {
        Self {
            store: context.store,
            #[cfg(feature = "sql")]
            transactions: context.transactions,
            token: context.token,
            lease: context.lease,
            handler: context.handler,
            store_timeout: context.store_timeout,
            max_output: context.max_output,
            in_transaction: AtomicBool::new(false),
            atomic_open: AtomicBool::new(false),
            progress: Mutex::new(Progress {
                recorded,
                used: Vec::new(),
                answer: None,
            }),
        }
    }

    /// The lease the execution holds.
    pub(crate) fn lease(&self) -> &LeaseSignal {
        &self.lease
    }

    /// Runs step `name` of `(scope, key)` (see
    /// [`IdempotencyKey::step`](crate::IdempotencyKey::step)).
    pub(crate) async fn run<T, E, Fut>(
        &self,
        scope: &str,
        key: &str,
        name: &str,
        step: impl FnOnce() -> Fut,
    ) -> Result<T, StepError<E>>
    where
        T: Serialize + DeserializeOwned,
        Fut: Future<Output = Result<T, E>>,
    {
        let ran = self.run_once(scope, key, name, step).await;
        self.noted(ran)
    }

    /// [`run`](Self::run), before its failure is noted.
    async fn run_once<T, E, Fut>(
        &self,
        scope: &str,
        key: &str,
        name: &str,
        step: impl FnOnce() -> Fut,
    ) -> Result<T, StepError<E>>
    where
        T: Serialize + DeserializeOwned,
        Fut: Future<Output = Result<T, E>>,
    {
        if let Start::Resume(output) = self.start(name)? {
            return self.resume(name, &output);
        }
        let output = match step().await {
            Ok(output) => output,
            Err(error) => {
                self.give_back(name);
                return Err(StepError::Failed(error));
            }
        };
        self.record(scope, key, name, output).await
    }

    /// Runs at-most-once step `name` of `(scope, key)` (see
    /// [`IdempotencyKey::step_at_most_once`](crate::IdempotencyKey::step_at_most_once)).
    pub(crate) async fn run_at_most_once<T, E, Fut, VFut>(
        &self,
        scope: &str,
        key: &str,
        name: &str,
        step: impl FnOnce() -> Fut,
        verify: impl FnOnce() -> VFut,
    ) -> Result<T, StepError<E>>
    where
        T: Serialize + DeserializeOwned,
        Fut: Future<Output = Result<T, E>>,
        VFut: Future<Output = Result<Verified<T>, E>>,
    {
        let ran = self
            .run_at_most_once_unnoted(scope, key, name, step, verify)
            .await;
        self.noted(ran)
    }

    /// [`run_at_most_once`](Self::run_at_most_once), before its failure is noted.
    async fn run_at_most_once_unnoted<T, E, Fut, VFut>(
        &self,
        scope: &str,
        key: &str,
        name: &str,
        step: impl FnOnce() -> Fut,
        verify: impl FnOnce() -> VFut,
    ) -> Result<T, StepError<E>>
    where
        T: Serialize + DeserializeOwned,
        Fut: Future<Output = Result<T, E>>,
        VFut: Future<Output = Result<Verified<T>, E>>,
    {
        match self.start(name)? {
            Start::Resume(output) => return self.resume(name, &output),
            Start::Verify => match verify().await {
                Ok(Verified::Happened(output)) => {
                    info!(
                        event = "step_verified",
                        step = name,
                        "an earlier call of the step took effect; recording its output"
                    );
                    return self.record(scope, key, name, output).await;
                }
                // The intent recorded before that call stays: it covers this one too.
                Ok(Verified::NotHappened) => {}
                Ok(Verified::Unknown) => {
                    return Err(StepError::OutcomeUnknown {
                        step: name.to_owned(),
                    });
                }
                Err(error) => {
                    self.give_back(name);
                    return Err(StepError::Failed(error));
                }
            },
            Start::Run => {
                // The intent is recorded before the call, so that a retry that finds no
                // output knows the call may have happened and asks instead of calling.
                let intent = RecordedStep::intent(name, SystemTime::now());
                let record = self.store.record_step(scope, key, self.token, &intent);
                let stored = metrics::timed(
                    StoreOperation::RecordStep,
                    bounded(self.store_timeout, record),
                )
                .await;
                // Not counted as a recorded step: the output, once there, is.
                if !matches!(stored, Ok(true)) {
                    return Err(self
                        .not_recorded(name, stored)
                        .expect("an answer other than recorded"));
                }
                // An inline retry of this step after its call failed verifies first too.
                self.progress
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .recorded
                    .push(intent);
            }
        }
        // The lease may have been lost while the intent or the verify was on its way: the
        // call is the effect, and it never starts without the licence.
        if self.lease.is_lost() {
            return Err(StepError::LeaseLost {
                step: name.to_owned(),
            });
        }
        let output = match step().await {
            Ok(output) => output,
            Err(error) => {
                self.give_back(name);
                return Err(StepError::Failed(error));
            }
        };
        self.record(scope, key, name, output).await
    }

    /// Records step `name`'s `output` under the claim; the output when it is recorded.
    async fn record<T: Serialize, E>(
        &self,
        scope: &str,
        key: &str,
        name: &str,
        output: T,
    ) -> Result<T, StepError<E>> {
        let recorded = self.recorded(name, &output)?;
        let record = self.store.record_step(scope, key, self.token, &recorded);
        let stored = metrics::timed(
            StoreOperation::RecordStep,
            bounded(self.store_timeout, record),
        );
        match self.not_recorded(name, stored.await) {
            None => Ok(output),
            Some(error) => Err(error),
        }
    }

    /// Runs atomic step `name` of `(scope, key)` in a transaction on database `DB` (see
    /// [`IdempotencyKey::atomic_step`](crate::IdempotencyKey::atomic_step)).
    #[cfg(feature = "sql")]
    pub(crate) async fn run_atomic<DB, T, E>(
        &self,
        scope: &str,
        key: &str,
        name: &str,
        step: impl AsyncFnOnce(&mut Tx<DB>) -> Result<T, E>,
    ) -> Result<T, StepError<E>>
    where
        DB: TxDatabase,
        T: Serialize + DeserializeOwned,
    {
        let ran = self.run_atomic_once(scope, key, name, step).await;
        self.noted(ran)
    }

    /// [`run_atomic`](Self::run_atomic), before its failure is noted.
    #[cfg(feature = "sql")]
    async fn run_atomic_once<DB, T, E>(
        &self,
        scope: &str,
        key: &str,
        name: &str,
        step: impl AsyncFnOnce(&mut Tx<DB>) -> Result<T, E>,
    ) -> Result<T, StepError<E>>
    where
        DB: TxDatabase,
        T: Serialize + DeserializeOwned,
    {
        if let Start::Resume(output) = self.start(name)? {
            return self.resume(name, &output);
        }
        let Some(tx_store) = self
            .transactions
            .as_ref()
            .and_then(TxSupport::for_database::<DB>)
        else {
            return Err(StepError::TransactionUnsupported {
                step: name.to_owned(),
                database: DB::DATABASE_NAME,
            });
        };
        let store_failed = |source| StepError::Store {
            step: name.to_owned(),
            source,
        };
        // Until the transaction ends, however the step ends (dropped included).
        let _open = Open::mark(&self.atomic_open);
        let begun = crate::transaction::begin(tx_store.as_ref())
            .await
            .map_err(store_failed)?;
        // The store may bound how long a transaction holds its lock (SQLite's one
        // writer); past it the step is dropped with its transaction, which rolls back.
        let mut tx = Tx::new(begun.transaction);
        let result = match tx_store.max_hold() {
            Some(hold) => tokio::time::timeout(hold, step(&mut tx))
                .await
                .map_err(|_| store_failed(StoreError::Timeout(hold)))?,
            None => step(&mut tx).await,
        };
        let mut transaction = tx.into_inner();
        let output = match result {
            Ok(output) => output,
            Err(error) => {
                rollback(transaction).await;
                self.give_back(name);
                return Err(StepError::Failed(error));
            }
        };
        let recorded = match self.recorded(name, &output) {
            Ok(recorded) => recorded,
            Err(error) => {
                rollback(transaction).await;
                return Err(error);
            }
        };
        let record = tx_store.record_step_in(&mut transaction, scope, key, self.token, &recorded);
        let stored = metrics::timed(
            StoreOperation::RecordStep,
            bounded(self.store_timeout, record),
        );
        let stored = stored.await;
        if !matches!(stored, Ok(true)) {
            rollback(transaction).await;
            return Err(self
                .not_recorded(name, stored)
                .expect("an answer other than recorded"));
        }
        let commit = async { transaction.commit().await.map_err(StoreError::from) };
        bounded(self.store_timeout, commit)
            .await
            .map_err(store_failed)?;
        drop(begun.permit);
        self.counted("recorded");
        Ok(output)
    }

    /// Notes what a step's failure asks of the claim (see [`StepAnswer`]), so the engine
    /// decides from it whatever response the handler makes of the error.
    fn noted<T, E>(&self, ran: Result<T, StepError<E>>) -> Result<T, StepError<E>> {
        if let Err(error) = &ran
            && let Some(answer) = StepAnswer::of(error)
        {
            let mut progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
            progress.answer = progress.answer.max(Some(answer));
        }
        ran
    }

    /// What the steps that failed ask of the claim, if anything.
    pub(crate) fn answer(&self) -> Option<StepAnswer> {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .answer
    }

    /// Marks the execution as a transactional handler's: its steps are refused
    /// ([`StepError::InsideTransaction`]).
    #[cfg(feature = "sql")]
    pub(crate) fn refuse_inside_transaction(&self) {
        self.in_transaction.store(true, Ordering::Relaxed);
    }

    /// Checks `name` and claims it for this execution: the recorded output when an
    /// earlier execution recorded it, else whether this one may run it.
    fn start<E>(&self, name: &str) -> Result<Start, StepError<E>> {
        if name.is_empty() || name.len() > MAX_STEP_NAME {
            return Err(StepError::InvalidName {
                step: name.to_owned(),
            });
        }
        if self.in_transaction.load(Ordering::Relaxed) || self.atomic_open.load(Ordering::Acquire) {
            return Err(StepError::InsideTransaction {
                step: name.to_owned(),
            });
        }
        let mut progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        if progress.used.iter().any(|used| used == name) {
            return Err(StepError::NameUsedTwice {
                step: name.to_owned(),
            });
        }
        progress.used.push(name.to_owned());
        // An output recorded after an intent of the same name settles it.
        let found = progress.recorded.iter().filter(|step| step.name == name);
        let (intent, output) = found.fold((false, None), |(intent, output), step| {
            if step.is_intent() {
                (true, output)
            } else {
                (intent, Some(step.output.clone()))
            }
        });
        if let Some(output) = output {
            return Ok(Start::Resume(output));
        }
        drop(progress);
        // The lease is the only licence to run: a step never starts without it.
        if self.lease.is_lost() {
            return Err(StepError::LeaseLost {
                step: name.to_owned(),
            });
        }
        Ok(if intent { Start::Verify } else { Start::Run })
    }

    /// Gives step `name` back after its own failure: nothing was recorded, so the handler
    /// may call it again in this execution.
    fn give_back(&self, name: &str) {
        let mut progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        progress.used.retain(|used| used != name);
    }

    /// The recorded `output` of step `name`, deserialised.
    fn resume<T: DeserializeOwned, E>(&self, name: &str, output: &[u8]) -> Result<T, StepError<E>> {
        let output = serde_json::from_slice(output).map_err(|source| StepError::Undecodable {
            step: name.to_owned(),
            source,
        })?;
        info!(
            event = "step_resumed",
            step = name,
            "step recorded by an earlier execution; not run again"
        );
        self.counted("resumed");
        Ok(output)
    }

    /// Step `name`'s `output` as the store records it.
    fn recorded<T: Serialize, E>(
        &self,
        name: &str,
        output: &T,
    ) -> Result<RecordedStep, StepError<E>> {
        let bytes = serde_json::to_vec(output).map_err(|source| StepError::Unserialisable {
            step: name.to_owned(),
            source,
        })?;
        if bytes.len() > self.max_output {
            return Err(StepError::TooLarge {
                step: name.to_owned(),
                len: bytes.len(),
                max: self.max_output,
            });
        }
        Ok(RecordedStep {
            name: name.to_owned(),
            output: Bytes::from(bytes),
            recorded_at: SystemTime::now(),
        })
    }

    /// Why step `name` was not recorded, from the store's answer; `None` when it was
    /// (and counted).
    fn not_recorded<E>(
        &self,
        name: &str,
        stored: Result<bool, StoreError>,
    ) -> Option<StepError<E>> {
        match stored {
            Ok(true) => {
                self.counted("recorded");
                None
            }
            Ok(false) => {
                // The token owns nothing: another execution took the key over.
                self.lease.raise();
                self.lease.count_loss_once(self.handler);
                warn!(
                    event = "step_lost",
                    step = name,
                    "the claim was taken over; the step's output was not recorded"
                );
                Some(StepError::LeaseLost {
                    step: name.to_owned(),
                })
            }
            Err(source) => {
                warn!(event = "store_error", step = name, error = %source, "recording a step failed");
                Some(StepError::Store {
                    step: name.to_owned(),
                    source,
                })
            }
        }
    }

    /// Counts one step of this handler under `outcome`.
    fn counted(&self, outcome: &'static str) {
        metrics::step(self.handler, outcome);
    }
}

/// A flag raised while it lives.
#[cfg(feature = "sql")]
struct Open<'a>(&'a AtomicBool);

#[cfg(feature = "sql")]
impl<'a> Open<'a> {
    fn mark(flag: &'a AtomicBool) -> Self {
        flag.store(true, Ordering::Release);
        Self(flag)
    }
}

#[cfg(feature = "sql")]
impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// `operation`, failed with [`StoreError::Timeout`] when it takes longer than `timeout`.
async fn bounded<T>(
    timeout: Duration,
    operation: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(timeout, operation)
        .await
        .unwrap_or(Err(StoreError::Timeout(timeout)))
}

/// Rolls `transaction` back; a failure leaves it to the connection, which discards it.
#[cfg(feature = "sql")]
async fn rollback<DB: TxDatabase>(transaction: sqlx::Transaction<'static, DB>) {
    if let Err(err) = transaction.rollback().await {
        warn!(error = %err, "rollback failed; the connection discards the transaction");
    }
}
