//! The NATS JetStream door: a pull consumer whose messages each run a function once per
//! message id, through [`Idempotency::once`] — the same store, claim, leases, heartbeat,
//! waiting and steps as an HTTP request.
//!
//! - **Key**: the `Nats-Msg-Id` header ([`JetStreamDoor::key_header`] names another); the
//!   same header JetStream's own duplicate window dedupes publishes by, so a message
//!   published again after that window (or redelivered, or delivered to another
//!   consumer) still runs once. [`JetStreamDoor::key_from`] reads it from the message
//!   itself instead, e.g. an id in its JSON payload.
//! - **Scope**: the stream's name by default ([`ScopeFrom`]), as JetStream scopes its ids.
//! - **Fingerprint**: the payload ([`Fingerprint::of_payload`]): the same id with another
//!   payload is refused ([`Outcome::KeyReused`]), terminated and dead-lettered.
//! - **Acknowledgement** follows [`Outcome::disposition`]: acknowledged (a double ack,
//!   confirmed by the server) only once the record is committed or replayed; a duplicate
//!   of a running message is nak'd with a delay of its lease's time left; a function's
//!   error (the claim released) and a store outage are nak'd with the door's
//!   [`retry_delay`](JetStreamDoor::retry_delay), so JetStream delivers the message again.
//! - **A message without its key** (no header, or `key_from` answers `None`):
//!   [`MissingKey`] decides — terminated (the
//!   default; dead-lettered first when a [`dead_letter`](JetStreamDoor::dead_letter)
//!   subject is set) or run unprotected.
//! - **The inbox**: [`JetStreamDoor::run_in_transaction`] hands the function a `Tx` on the
//!   store's database; its writes commit with the message's record, before the ack.
//!
//! A consumer that crashes mid-message leaves its claim in the store: JetStream delivers
//! the message again after the consumer's `ack_wait`, and the delivery is nak'd as in
//! progress until the crashed claim's lease runs out; then it is taken over and runs,
//! resuming after the steps the crashed run recorded. Set `ack_wait` above the time a
//! message usually takes, so that a slow run is not redelivered while it still runs (a
//! redelivery meanwhile is only nak'd, never run alongside).
//!
//! ```no_run
//! use async_nats::jetstream::{self, consumer::pull};
//! use idempotent_runtime::doors::nats::{JetStreamDoor, MissingKey};
//! use idempotent_runtime::store::MemoryStore;
//! use idempotent_runtime::{HandlerConfig, Idempotency};
//!
//! # async fn consume() -> Result<(), Box<dyn std::error::Error>> {
//! let client = async_nats::connect("nats://127.0.0.1:4222").await?;
//! let jetstream = jetstream::new(client);
//! let stream = jetstream.get_stream("ORDERS").await?;
//! let consumer = stream
//!     .get_or_create_consumer::<pull::Config>("charger", pull::Config {
//!         durable_name: Some("charger".into()),
//!         ..Default::default()
//!     })
//!     .await?;
//!
//! let door = JetStreamDoor::new(Idempotency::new(MemoryStore::new()))
//!     .config(HandlerConfig::new().name("charge"))
//!     .missing_key(MissingKey::Terminate)
//!     .dead_letter("DEAD.orders");
//! door.run(&consumer, |key, message| async move {
//!     // One charge per message id, whatever JetStream redelivers.
//!     let amount: u64 = std::str::from_utf8(&message.payload)?.parse()?;
//!     Ok::<_, Box<dyn std::error::Error + Send + Sync>>(format!("{amount} under {}", key.derive("gateway")))
//! })
//! .await?;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{Consumer, pull};
use async_nats::jetstream::{self, AckKind};
use futures_util::StreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{error, info, warn};

use crate::config::HandlerConfig;
use crate::engine::{Disposition, Idempotency, Outcome};
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
#[cfg(feature = "sql")]
use crate::transaction::{Tx, TxDatabase};

/// Reads a message's key from the message itself ([`JetStreamDoor::key_from`]).
type KeyFunction = Arc<dyn Fn(&async_nats::Message) -> Option<String> + Send + Sync>;

/// Where a message's key comes from.
#[derive(Clone)]
enum KeySource {
    /// The last value of this header.
    Header(Arc<str>),
    /// What this function reads from the message.
    Message(KeyFunction),
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Header(name) => f.debug_tuple("Header").field(name).finish(),
            Self::Message(_) => f.write_str("Message(..)"),
        }
    }
}

/// The header a message's id is read from unless [`JetStreamDoor::key_header`] says
/// otherwise: the one JetStream dedupes publishes by.
pub const DEFAULT_KEY_HEADER: &str = "Nats-Msg-Id";

/// The header a dead-lettered message carries, saying why it was rejected.
pub const REJECTED_HEADER: &str = "Idempotent-Rejected";

/// The header a dead-lettered message carries: the subject it was delivered on.
pub const ORIGINAL_SUBJECT_HEADER: &str = "Idempotent-Original-Subject";

/// A transactional message function, `async |key, message, tx: &mut Tx<DB>| …`, whose
/// future is `Send`: implemented by every such closure, and never named by an application
/// (see [`TxFunction`](crate::transaction::TxFunction) for why it exists).
#[cfg(feature = "sql")]
pub trait MessageTxFunction<'tx, DB: TxDatabase, T, E>:
    FnOnce(IdempotencyKey, async_nats::Message, &'tx mut Tx<DB>) -> Self::Running
{
    /// The future of one call, borrowing the transaction.
    type Running: Future<Output = Result<T, E>> + Send + 'tx;
}

#[cfg(feature = "sql")]
impl<'tx, DB, T, E, F, Running> MessageTxFunction<'tx, DB, T, E> for F
where
    DB: TxDatabase,
    F: FnOnce(IdempotencyKey, async_nats::Message, &'tx mut Tx<DB>) -> Running,
    Running: Future<Output = Result<T, E>> + Send + 'tx,
{
    type Running = Running;
}

/// Where a message's scope comes from: message ids are unique within it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ScopeFrom {
    /// The stream's name (the default): JetStream's own duplicate window is per stream.
    #[default]
    Stream,
    /// The subject the message was published on.
    Subject,
    /// This fixed scope, for every message.
    Fixed(String),
}

/// What the door does with a message that carries no key header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingKey {
    /// Terminate it (`AckKind::Term`: JetStream stops delivering it; the stream keeps it
    /// under its retention), published first to the
    /// [`dead_letter`](JetStreamDoor::dead_letter) subject when one is set. The default:
    /// without an id the door cannot tell a redelivery from a new message.
    #[default]
    Terminate,
    /// Run the function without protection, as a plain consumer would: every delivery
    /// runs it, and a failure naks it. The key handed to the function is not claimed
    /// (its `step` answers `NotClaimed`); its name is the message's stream sequence, so
    /// its [`derive`](IdempotencyKey::derive) is the same for every delivery of it.
    RunUnprotected,
}

/// What the door answered the server for one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Acknowledged, confirmed by the server (a double ack).
    Ack,
    /// Negatively acknowledged: delivered again after this delay.
    Nak(Duration),
    /// Terminated: never delivered again.
    Term,
}

/// How the door handled one message ([`JetStreamDoor::handle`]).
#[derive(Debug)]
pub enum Handled<T, E> {
    /// The message had a key: the function went through the engine.
    Protected {
        /// What the engine answered.
        outcome: Outcome<T, E>,
        /// What the server was told.
        reply: Reply,
        /// Whether it was published to the dead-letter subject first (a key reused).
        dead_lettered: bool,
    },
    /// The message had no key and [`MissingKey::RunUnprotected`]: the function ran.
    Unprotected {
        /// What the function returned.
        result: Result<T, E>,
        /// What the server was told.
        reply: Reply,
    },
    /// The message had no key and nothing ran: [`MissingKey::Terminate`] (or no
    /// transaction could be begun for an unprotected transactional run).
    MissingKey {
        /// What the server was told (`Nak` when the dead-letter publish failed, or a
        /// transactional function's unprotected run could not begin its transaction, so
        /// the message is not lost).
        reply: Reply,
        /// Whether it was published to the dead-letter subject.
        dead_lettered: bool,
    },
}

impl<T, E> Handled<T, E> {
    /// What the server was told.
    ///
    /// ```
    /// use idempotent_runtime::Outcome;
    /// use idempotent_runtime::doors::nats::{Handled, Reply};
    ///
    /// let handled: Handled<u8, String> = Handled::Protected {
    ///     outcome: Outcome::Replayed(1),
    ///     reply: Reply::Ack,
    ///     dead_lettered: false,
    /// };
    /// assert_eq!(handled.reply(), Reply::Ack);
    /// ```
    pub fn reply(&self) -> Reply {
        match self {
            Self::Protected { reply, .. }
            | Self::Unprotected { reply, .. }
            | Self::MissingKey { reply, .. } => *reply,
        }
    }
}

/// A message the door could not handle or answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsDoorError {
    /// The message carries no JetStream reply subject (it was not delivered by a
    /// consumer): nothing ran.
    #[error("not a JetStream message (no ack subject): {0}")]
    NotJetStream(String),
    /// The reply to the server failed (the connection dropped): the server delivers the
    /// message again after its `ack_wait`, and the engine replays or reruns it as its
    /// record says.
    #[error("answering the server ({reply:?}) failed: {error}")]
    Reply {
        /// What the door tried to tell the server.
        reply: Reply,
        /// The client's error.
        error: String,
    },
    /// Fetching messages from the consumer failed.
    #[error("reading the consumer's messages failed: {0}")]
    Messages(String),
}

/// A NATS JetStream consumer runner over [`Idempotency::once`]: see the
/// [module docs](self). Cheap to clone; building one needs no connection.
///
/// ```
/// use std::time::Duration;
///
/// use idempotent_runtime::doors::nats::{JetStreamDoor, MissingKey, ScopeFrom};
/// use idempotent_runtime::store::MemoryStore;
/// use idempotent_runtime::{HandlerConfig, Idempotency};
///
/// let door = JetStreamDoor::new(Idempotency::new(MemoryStore::new()))
///     .config(HandlerConfig::new().name("charge").wait(Duration::from_secs(5)))
///     .key_header("Order-Id")
///     .scope(ScopeFrom::Fixed("orders".into()))
///     .missing_key(MissingKey::RunUnprotected)
///     .dead_letter("DEAD.orders")
///     .retry_delay(Duration::from_millis(500))
///     .concurrency(32);
/// # let _ = door;
/// ```
#[derive(Debug, Clone)]
pub struct JetStreamDoor {
    idempotency: Idempotency,
    config: HandlerConfig,
    key: KeySource,
    scope: ScopeFrom,
    missing_key: MissingKey,
    dead_letter: Option<Arc<str>>,
    retry_delay: Duration,
    concurrency: usize,
}

impl JetStreamDoor {
    /// A door over `idempotency` with the defaults: key header `Nats-Msg-Id`, scope the
    /// stream's name, messages without a key terminated, no dead-letter subject, a
    /// retry delay of one second and 16 messages handled at once.
    pub fn new(idempotency: Idempotency) -> Self {
        Self {
            idempotency,
            config: HandlerConfig::new(),
            key: KeySource::Header(Arc::from(DEFAULT_KEY_HEADER)),
            scope: ScopeFrom::Stream,
            missing_key: MissingKey::Terminate,
            dead_letter: None,
            retry_delay: Duration::from_secs(1),
            concurrency: 16,
        }
    }

    /// The policy each message runs under (name, TTL, lease, maximum duration, wait),
    /// as an HTTP handler's.
    pub fn config(mut self, config: HandlerConfig) -> Self {
        self.config = config;
        self
    }

    /// The header a message's key is read from (default [`DEFAULT_KEY_HEADER`]).
    pub fn key_header(mut self, name: &str) -> Self {
        self.key = KeySource::Header(Arc::from(name));
        self
    }

    /// Reads a message's key from the message itself, in place of a header: `None` (or an
    /// empty key) is a message without a key, handled as [`missing_key`](Self::missing_key)
    /// says. The publisher must put the same key in every copy of a message.
    ///
    /// ```
    /// use idempotent_runtime::Idempotency;
    /// use idempotent_runtime::doors::nats::JetStreamDoor;
    /// use idempotent_runtime::store::MemoryStore;
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Command {
    ///     id: String,
    /// }
    ///
    /// // `{"id": "cmd_1", …}`: keyed by the command's id.
    /// let door = JetStreamDoor::new(Idempotency::new(MemoryStore::new())).key_from(|message| {
    ///     let command: Command = serde_json::from_slice(&message.payload).ok()?;
    ///     Some(command.id)
    /// });
    /// # let _ = door;
    /// ```
    pub fn key_from<K>(mut self, key: K) -> Self
    where
        K: Fn(&async_nats::Message) -> Option<String> + Send + Sync + 'static,
    {
        self.key = KeySource::Message(Arc::new(key));
        self
    }

    /// Where a message's scope comes from (default [`ScopeFrom::Stream`]).
    pub fn scope(mut self, scope: ScopeFrom) -> Self {
        self.scope = scope;
        self
    }

    /// What to do with a message without a key (default [`MissingKey::Terminate`]).
    pub fn missing_key(mut self, missing: MissingKey) -> Self {
        self.missing_key = missing;
        self
    }

    /// A JetStream subject rejected messages are published to before they are
    /// terminated: one without a key (under [`MissingKey::Terminate`]) and one whose id
    /// was used for another payload. It carries the original headers and payload, plus
    /// [`REJECTED_HEADER`] and [`ORIGINAL_SUBJECT_HEADER`]. A stream must capture the
    /// subject: the publish is confirmed by JetStream, and a message whose publish fails
    /// is nak'd rather than terminated, so it is not lost. Not a subject the consumer
    /// itself reads: a dead letter that comes back to it is terminated, not published
    /// again.
    pub fn dead_letter(mut self, subject: &str) -> Self {
        self.dead_letter = Some(Arc::from(subject));
        self
    }

    /// How long a message waits before its next delivery after a failure that released
    /// its claim, a store outage or an unconfirmed record (default one second). A
    /// duplicate of a running message waits its lease's time left instead.
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// How many messages [`run`](Self::run) handles at once (default 16; at least 1).
    pub fn concurrency(mut self, messages: usize) -> Self {
        self.concurrency = messages.max(1);
        self
    }

    /// Handles `consumer`'s messages, each through [`handle`](Self::handle), up to
    /// [`concurrency`](Self::concurrency) at once, until its message stream ends. A
    /// message the door cannot answer is logged (the server delivers it again after
    /// `ack_wait`); an error reading the stream is logged and reading goes on (the
    /// client reconnects). Dropping the future stops it: each function already running
    /// finishes through the engine (nothing cancels it), and its message, unanswered, is
    /// delivered again and replayed.
    ///
    /// # Errors
    ///
    /// [`NatsDoorError::Messages`] when the consumer's message stream cannot be opened.
    pub async fn run<F, Fut, T, E>(
        &self,
        consumer: &Consumer<pull::Config>,
        function: F,
    ) -> Result<(), NatsDoorError>
    where
        F: Fn(IdempotencyKey, async_nats::Message) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        self.each_message(consumer, |message| {
            let function = function.clone();
            async move { self.handle(message, function).await.map(drop) }
        })
        .await
    }

    /// Like [`run`](Self::run), for a function whose writes go to the engine's store's
    /// own database: each message through
    /// [`handle_in_transaction`](Self::handle_in_transaction).
    ///
    /// ```no_run
    /// use async_nats::jetstream::consumer::{Consumer, pull};
    /// use idempotent_runtime::doors::nats::JetStreamDoor;
    /// use idempotent_runtime::transaction::Tx;
    /// use sqlx::Sqlite;
    ///
    /// # async fn inbox(door: JetStreamDoor, consumer: Consumer<pull::Config>) -> Result<(), Box<dyn std::error::Error>> {
    /// // One ledger row per message id, committed with its record before the ack.
    /// door.run_in_transaction(&consumer, async |key, message, tx: &mut Tx<Sqlite>| {
    ///     let written = sqlx::query("INSERT INTO ledger (message, payload) VALUES (?, ?)")
    ///         .bind(key.as_str().to_owned())
    ///         .bind(message.payload.to_vec())
    ///         .execute(tx.conn())
    ///         .await?;
    ///     Ok::<_, sqlx::Error>(written.rows_affected())
    /// })
    /// .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`NatsDoorError::Messages`] when the consumer's message stream cannot be opened.
    #[cfg(feature = "sql")]
    pub async fn run_in_transaction<DB, F, T, E>(
        &self,
        consumer: &Consumer<pull::Config>,
        function: F,
    ) -> Result<(), NatsDoorError>
    where
        DB: TxDatabase,
        F: AsyncFnOnce(IdempotencyKey, async_nats::Message, &mut Tx<DB>) -> Result<T, E>
            + for<'tx> MessageTxFunction<'tx, DB, T, E>
            + Clone
            + Send
            + Sync
            + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        self.each_message(consumer, |message| {
            let function = function.clone();
            async move {
                self.handle_in_transaction(message, function)
                    .await
                    .map(drop)
            }
        })
        .await
    }

    /// Reads `consumer`'s messages and hands each to `each`, up to
    /// [`concurrency`](Self::concurrency) at once, logging what goes wrong.
    async fn each_message<H, HFut>(
        &self,
        consumer: &Consumer<pull::Config>,
        each: H,
    ) -> Result<(), NatsDoorError>
    where
        H: Fn(jetstream::Message) -> HFut,
        HFut: Future<Output = Result<(), NatsDoorError>>,
    {
        let messages = consumer
            .messages()
            .await
            .map_err(|err| NatsDoorError::Messages(err.to_string()))?;
        messages
            .for_each_concurrent(self.concurrency, |message| {
                let handled = message.map(&each);
                async move {
                    let handled = match handled {
                        Ok(handled) => handled,
                        Err(err) => {
                            warn!(door = "nats", error = %err, "reading the consumer's messages failed");
                            return;
                        }
                    };
                    if let Err(err) = handled.await {
                        error!(door = "nats", error = %err, "message not answered; the server delivers it again after ack_wait");
                    }
                }
            })
            .await;
        Ok(())
    }

    /// Handles one message delivered by a JetStream consumer: runs `function` through
    /// the engine under the message's key, scope and payload, then answers the server
    /// as the outcome's [`disposition`](Outcome::disposition) says (see the
    /// [module docs](self)).
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// use async_nats::jetstream::consumer::{Consumer, pull};
    /// use futures_util::StreamExt;
    /// use idempotent_runtime::doors::nats::{Handled, JetStreamDoor, Reply};
    ///
    /// # async fn batch(door: JetStreamDoor, consumer: Consumer<pull::Config>) -> Result<(), async_nats::Error> {
    /// let mut batch = consumer.fetch().max_messages(10).messages().await?;
    /// while let Some(message) = batch.next().await {
    ///     let handled = door
    ///         .handle(message?, |_key, message| async move {
    ///             Ok::<_, String>(message.payload.len())
    ///         })
    ///         .await?;
    ///     if let Reply::Nak(delay) = handled.reply() {
    ///         tracing::info!(?delay, "delivered again later");
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The message is not a JetStream delivery (nothing ran), or answering the server
    /// failed (the server delivers it again after `ack_wait`).
    pub async fn handle<F, Fut, T, E>(
        &self,
        message: jetstream::Message,
        function: F,
    ) -> Result<Handled<T, E>, NatsDoorError>
    where
        F: FnOnce(IdempotencyKey, async_nats::Message) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let delivery = self.delivery(&message)?;
        let inner = message.message.clone();
        let Some(key) = delivery.key else {
            if self.missing_key == MissingKey::Terminate {
                return self.terminate_keyless(&message).await;
            }
            let key = IdempotencyKey::new(delivery.scope, format!("seq-{}", delivery.sequence));
            let result = function(key, inner).await;
            return self.answer_unprotected(&message, result).await;
        };
        let outcome = self
            .idempotency
            .once(
                &self.config,
                &delivery.scope,
                &key,
                Fingerprint::of_payload(&message.payload),
                move |key| function(key, inner),
            )
            .await;
        self.answer_outcome(&message, &delivery.scope, &key, outcome)
            .await
    }

    /// Like [`handle`](Self::handle), for a function whose writes go to the engine's
    /// store's own database (a transactional inbox): its writes through the `Tx` and the
    /// message's record commit together, through
    /// [`Idempotency::once_in_transaction`], before the message is acknowledged.
    /// Under [`MissingKey::RunUnprotected`] a message without a key runs in a
    /// transaction of its own, committed on `Ok` and rolled back on `Err`, with no record.
    ///
    /// # Errors
    ///
    /// As [`handle`](Self::handle).
    #[cfg(feature = "sql")]
    pub async fn handle_in_transaction<DB, F, T, E>(
        &self,
        message: jetstream::Message,
        function: F,
    ) -> Result<Handled<T, E>, NatsDoorError>
    where
        DB: TxDatabase,
        F: AsyncFnOnce(IdempotencyKey, async_nats::Message, &mut Tx<DB>) -> Result<T, E>
            + for<'tx> MessageTxFunction<'tx, DB, T, E>
            + Send
            + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let delivery = self.delivery(&message)?;
        let inner = message.message.clone();
        let Some(key) = delivery.key else {
            if self.missing_key == MissingKey::Terminate {
                return self.terminate_keyless(&message).await;
            }
            let key = IdempotencyKey::new(delivery.scope, format!("seq-{}", delivery.sequence));
            return match self.unprotected_transaction(key, inner, function).await {
                Some(result) => self.answer_unprotected(&message, result).await,
                // No transaction to run it in: delivered again later, never lost.
                None => {
                    let reply = Reply::Nak(self.retry_delay);
                    answer(&message, reply).await?;
                    Ok(Handled::MissingKey {
                        reply,
                        dead_lettered: false,
                    })
                }
            };
        };
        let outcome = self
            .idempotency
            .once_in_transaction_owned(
                &self.config,
                &delivery.scope,
                &key,
                Fingerprint::of_payload(&message.payload).into(),
                move |key, mut tx: Tx<DB>| async move {
                    let result = function(key, inner, &mut tx).await;
                    (result, tx)
                },
            )
            .await;
        self.answer_outcome(&message, &delivery.scope, &key, outcome)
            .await
    }

    /// Runs a keyless message's transactional function unprotected, in a transaction of
    /// the store's database; `None` when none could be begun (logged).
    #[cfg(feature = "sql")]
    async fn unprotected_transaction<DB, F, T, E>(
        &self,
        key: IdempotencyKey,
        message: async_nats::Message,
        function: F,
    ) -> Option<Result<T, E>>
    where
        DB: TxDatabase,
        F: for<'tx> MessageTxFunction<'tx, DB, T, E>,
    {
        let (permit, mut tx) = super::begin_unprotected::<DB>(&self.idempotency, "nats").await?;
        let result = function(key, message, &mut tx).await;
        super::end_unprotected(permit, tx, result, "nats").await
    }

    /// Where a message comes from and what it is keyed by.
    fn delivery(&self, message: &jetstream::Message) -> Result<Delivery, NatsDoorError> {
        let (stream, sequence) = match message.info() {
            Ok(info) => (info.stream.to_owned(), info.stream_sequence),
            Err(err) => return Err(NatsDoorError::NotJetStream(err.to_string())),
        };
        let scope = match &self.scope {
            ScopeFrom::Stream => stream,
            ScopeFrom::Subject => message.subject.to_string(),
            ScopeFrom::Fixed(scope) => scope.clone(),
        };
        let key = match &self.key {
            KeySource::Header(name) => message
                .headers
                .as_ref()
                .and_then(|headers| headers.get_last(&**name))
                .map(|value| value.as_str().to_owned()),
            KeySource::Message(read) => read(&message.message),
        }
        .filter(|key| !key.is_empty());
        Ok(Delivery {
            scope,
            key,
            sequence,
        })
    }

    /// Answers the server as `outcome`'s disposition says.
    async fn answer_outcome<T, E: fmt::Display>(
        &self,
        message: &jetstream::Message,
        scope: &str,
        key: &str,
        outcome: Outcome<T, E>,
    ) -> Result<Handled<T, E>, NatsDoorError> {
        let (reply, dead_lettered) = match outcome.disposition() {
            Disposition::Acknowledge => (Reply::Ack, false),
            Disposition::Redeliver(after) => (Reply::Nak(after.unwrap_or(self.retry_delay)), false),
            Disposition::Reject => {
                warn!(
                    door = "nats",
                    scope, key, "message id reused with another payload; rejecting it"
                );
                self.reject(message, "the message id was used for another payload")
                    .await
            }
        };
        let (replied, delay) = match reply {
            Reply::Ack => ("acknowledged", None),
            Reply::Nak(delay) => ("nak'd for redelivery", Some(delay)),
            Reply::Term => ("terminated", None),
        };
        super::log_answered("nats", scope, key, &outcome, replied, delay);
        answer(message, reply).await?;
        Ok(Handled::Protected {
            outcome,
            reply,
            dead_lettered,
        })
    }

    /// A message without a key under [`MissingKey::Terminate`]: dead-lettered (if
    /// configured) and terminated.
    async fn terminate_keyless<T, E>(
        &self,
        message: &jetstream::Message,
    ) -> Result<Handled<T, E>, NatsDoorError> {
        error!(
            door = "nats",
            subject = %message.subject,
            key = ?self.key,
            "message without its key; terminating it (MissingKey::Terminate)"
        );
        let (reply, dead_lettered) = self.reject(message, "the message has no key").await;
        answer(message, reply).await?;
        Ok(Handled::MissingKey {
            reply,
            dead_lettered,
        })
    }

    /// Answers a message run unprotected: acknowledged on `Ok`, nak'd on `Err`.
    async fn answer_unprotected<T, E: fmt::Display>(
        &self,
        message: &jetstream::Message,
        result: Result<T, E>,
    ) -> Result<Handled<T, E>, NatsDoorError> {
        let reply = match &result {
            Ok(_) => Reply::Ack,
            Err(err) => {
                info!(door = "nats", error = %err, "unprotected message failed; nak'd for redelivery");
                Reply::Nak(self.retry_delay)
            }
        };
        answer(message, reply).await?;
        Ok(Handled::Unprotected { result, reply })
    }

    /// Publishes a rejected message to the dead-letter subject, if there is one, and
    /// says how to answer it: terminated, or nak'd when the publish failed.
    async fn reject(&self, message: &jetstream::Message, why: &str) -> (Reply, bool) {
        let Some(subject) = &self.dead_letter else {
            return (Reply::Term, false);
        };
        if message.subject.as_str() == &**subject {
            // A dead letter delivered back to this consumer: publishing it again would
            // loop, and it is already kept where it is.
            error!(
                door = "nats",
                dead_letter = &**subject,
                "a dead letter came back to the consumer; terminated, not published again"
            );
            return (Reply::Term, false);
        }
        let mut headers = message.headers.clone().unwrap_or_default();
        headers.insert(REJECTED_HEADER, why);
        headers.insert(ORIGINAL_SUBJECT_HEADER, message.subject.as_str());
        let published = async {
            message
                .context
                .publish_with_headers(subject.to_string(), headers, message.payload.clone())
                .await?
                .await?;
            Ok::<_, async_nats::Error>(())
        };
        match published.await {
            Ok(()) => (Reply::Term, true),
            Err(err) => {
                error!(door = "nats", dead_letter = &**subject, error = %err, "publishing to the dead-letter subject failed; nak'd instead of terminated");
                (Reply::Nak(self.retry_delay), false)
            }
        }
    }
}

/// Where a message comes from and what it is keyed by.
struct Delivery {
    scope: String,
    /// `None`: the message carries no (or an empty) key.
    key: Option<String>,
    /// Its sequence in the stream (the name of an unprotected run's key).
    sequence: u64,
}

/// Tells the server `reply`: an ack is confirmed (a double ack) so that it is known to
/// have landed; a nak or a term that is lost only means a redelivery after `ack_wait`.
async fn answer(message: &jetstream::Message, reply: Reply) -> Result<(), NatsDoorError> {
    let sent = match reply {
        Reply::Ack => message.double_ack().await,
        Reply::Nak(delay) => message.ack_with(AckKind::Nak(Some(delay))).await,
        Reply::Term => message.ack_with(AckKind::Term).await,
    };
    sent.map_err(|err| NatsDoorError::Reply {
        reply,
        error: err.to_string(),
    })
}
