//! The RabbitMQ door: a consumer whose deliveries each run a function once per message
//! id, through [`Idempotency::once`] — the same store, claim, leases, heartbeat, waiting
//! and steps as an HTTP request.
//!
//! - **Key**: the `message_id` property ([`KeyFrom::MessageId`]; [`KeyFrom::Header`] reads
//!   a header instead). The publisher sets it once per logical message and keeps it on
//!   every republish, so a message published twice, redelivered after a consumer's
//!   crash, or delivered to two consumers runs once. [`RabbitDoor::key_from`] reads it
//!   from the delivery itself instead, e.g. an id in its JSON body.
//! - **Scope**: the queue's name by default ([`ScopeFrom`]).
//! - **Fingerprint**: the body ([`Fingerprint::of_payload`]): the same id with another
//!   body is refused ([`Outcome::KeyReused`]) and rejected, dead-lettered where the queue
//!   has a dead-letter exchange.
//! - **Acknowledgement** follows [`Outcome::disposition`]: `basic.ack` only once the
//!   record is committed or replayed. A duplicate of a running message is requeued after
//!   its lease's time left, a function's error (its claim released) and a store outage
//!   after the door's [`retry_delay`](RabbitDoor::retry_delay): the door holds the
//!   delivery that long, then `basic.nack`s it with `requeue`. RabbitMQ has no delayed
//!   requeue of its own, and an immediate one would hand the message straight back; a
//!   held delivery counts against the channel's prefetch, so set `basic.qos` above the
//!   door's [`concurrency`](RabbitDoor::concurrency).
//! - **The `redelivered` flag** is not taken as proof of a duplicate: RabbitMQ sets it on
//!   any delivery that may have been seen before, including one whose first consumer
//!   never started it. The record decides, as for every other delivery.
//! - **A delivery without its id** (or `key_from` answering `None`): [`MissingKey`]
//!   decides — rejected without requeue (the default: the queue's dead-letter exchange
//!   gets it, if it has one) or run unprotected.
//! - **The inbox**: [`RabbitDoor::run_in_transaction`] hands the function a `Tx` on the
//!   store's database; its writes commit with the delivery's record, before the
//!   `basic.ack`.
//!
//! A consumer that crashes mid-message leaves its claim in the store: RabbitMQ requeues
//! the unacknowledged delivery when the channel closes, and the next delivery is held
//! and requeued as in progress until the crashed claim's lease runs out; then it is
//! taken over and runs, resuming after the steps the crashed run recorded.
//!
//! ```no_run
//! use idempotent_runtime::doors::rabbitmq::RabbitDoor;
//! use idempotent_runtime::store::MemoryStore;
//! use idempotent_runtime::{HandlerConfig, Idempotency};
//! use lapin::options::{BasicConsumeOptions, BasicQosOptions};
//! use lapin::types::FieldTable;
//! use lapin::{Connection, ConnectionProperties};
//!
//! # async fn consume() -> Result<(), Box<dyn std::error::Error>> {
//! let connection =
//!     Connection::connect("amqp://guest:guest@127.0.0.1:5672/%2f", ConnectionProperties::default())
//!         .await?;
//! let channel = connection.create_channel().await?;
//! channel.basic_qos(64, BasicQosOptions::default()).await?;
//! let consumer = channel
//!     .basic_consume("orders".into(), "charger".into(), BasicConsumeOptions::default(), FieldTable::default())
//!     .await?;
//!
//! let door = RabbitDoor::new(Idempotency::new(MemoryStore::new()))
//!     .config(HandlerConfig::new().name("charge"))
//!     .concurrency(32);
//! door.run(consumer, |key, message| async move {
//!     // One charge per message id, whatever RabbitMQ redelivers.
//!     let amount: u64 = std::str::from_utf8(&message.body)?.parse()?;
//!     Ok::<_, Box<dyn std::error::Error + Send + Sync>>(format!("{amount} under {}", key.derive("gateway")))
//! })
//! .await;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::protocol::BasicProperties;
use lapin::types::AMQPValue;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{error, info, warn};

use crate::config::HandlerConfig;
use crate::engine::{Disposition, Idempotency, Outcome};
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
#[cfg(feature = "sql")]
use crate::transaction::{Tx, TxDatabase};

/// A transactional delivery function, `async |key, received, tx: &mut Tx<DB>| …`, whose
/// future is `Send`: implemented by every such closure, and never named by an application
/// (see [`TxFunction`](crate::transaction::TxFunction) for why it exists).
#[cfg(feature = "sql")]
pub trait DeliveryTxFunction<'tx, DB: TxDatabase, T, E>:
    FnOnce(IdempotencyKey, Received, &'tx mut Tx<DB>) -> Self::Running
{
    /// The future of one call, borrowing the transaction.
    type Running: Future<Output = Result<T, E>> + Send + 'tx;
}

#[cfg(feature = "sql")]
impl<'tx, DB, T, E, F, Running> DeliveryTxFunction<'tx, DB, T, E> for F
where
    DB: TxDatabase,
    F: FnOnce(IdempotencyKey, Received, &'tx mut Tx<DB>) -> Running,
    Running: Future<Output = Result<T, E>> + Send + 'tx,
{
    type Running = Running;
}

/// Reads a delivery's key from the delivery itself ([`RabbitDoor::key_from`]).
type KeyFunction = Arc<dyn Fn(&Received) -> Option<String> + Send + Sync>;

/// Where a delivery's key comes from: a property or header, or a function of the
/// delivery.
#[derive(Clone)]
enum KeySource {
    /// The property or header [`KeyFrom`] names.
    Property(KeyFrom),
    /// What this function reads from the delivery.
    Delivery(KeyFunction),
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Property(from) => f.debug_tuple("Property").field(from).finish(),
            Self::Delivery(_) => f.write_str("Delivery(..)"),
        }
    }
}

/// Where a delivery's key comes from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum KeyFrom {
    /// The `message_id` property (the default).
    #[default]
    MessageId,
    /// A header of this name, whose value is a string.
    Header(String),
}

/// Where a delivery's scope comes from: message ids are unique within it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ScopeFrom {
    /// The name of the queue the consumer reads (the default).
    #[default]
    Queue,
    /// The delivery's routing key.
    RoutingKey,
    /// This fixed scope, for every delivery.
    Fixed(String),
}

/// What the door does with a delivery that carries no key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingKey {
    /// Reject it without requeue: RabbitMQ drops it, or dead-letters it to the queue's
    /// dead-letter exchange (`x-dead-letter-exchange`). The default: without an id the
    /// door cannot tell a redelivery from a new message.
    #[default]
    Reject,
    /// Run the function without protection, as a plain consumer would: every delivery
    /// runs it, and a failure requeues it. The key handed to the function is not claimed
    /// (its `step` answers `NotClaimed`); its name is the delivery tag.
    RunUnprotected,
}

/// What the door answered the broker for one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// `basic.ack`.
    Ack,
    /// Held this long, then `basic.nack` with `requeue`: delivered again.
    Requeue(Duration),
    /// `basic.reject` without `requeue`: dropped, or dead-lettered.
    Reject,
}

/// A delivery as the function sees it: everything but the means to acknowledge it,
/// which stays with the door.
#[derive(Debug, Clone)]
pub struct Received {
    /// The body.
    pub body: Vec<u8>,
    /// The properties (`message_id`, headers, content type, …).
    pub properties: BasicProperties,
    /// The exchange it was published to.
    pub exchange: String,
    /// Its routing key.
    pub routing_key: String,
    /// RabbitMQ's `redelivered` flag: it may have been delivered before (a hint, not
    /// proof of a duplicate).
    pub redelivered: bool,
}

/// How the door handled one delivery ([`RabbitDoor::handle`]).
#[derive(Debug)]
pub enum Handled<T, E> {
    /// The delivery had a key: the function went through the engine.
    Protected {
        /// What the engine answered.
        outcome: Outcome<T, E>,
        /// What the broker was told.
        reply: Reply,
    },
    /// The delivery had no key and [`MissingKey::RunUnprotected`]: the function ran.
    Unprotected {
        /// What the function returned.
        result: Result<T, E>,
        /// What the broker was told.
        reply: Reply,
    },
    /// The delivery had no key and [`MissingKey::Reject`]: nothing ran.
    MissingKey,
    /// The delivery had no key and [`MissingKey::RunUnprotected`], but no transaction
    /// could be begun for its transactional function: nothing ran.
    Unrun {
        /// What the broker was told (a requeue, so the delivery is not lost).
        reply: Reply,
    },
}

impl<T, E> Handled<T, E> {
    /// What the broker was told.
    ///
    /// ```
    /// use idempotent_runtime::Outcome;
    /// use idempotent_runtime::doors::rabbitmq::{Handled, Reply};
    ///
    /// let handled: Handled<u8, String> = Handled::Protected {
    ///     outcome: Outcome::Replayed(1),
    ///     reply: Reply::Ack,
    /// };
    /// assert_eq!(handled.reply(), Reply::Ack);
    /// ```
    pub fn reply(&self) -> Reply {
        match self {
            Self::Protected { reply, .. }
            | Self::Unprotected { reply, .. }
            | Self::Unrun { reply } => *reply,
            Self::MissingKey => Reply::Reject,
        }
    }
}

/// A delivery the door could not answer, or a consumer it could not read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RabbitDoorError {
    /// Answering the broker failed (the channel closed): RabbitMQ requeues the delivery,
    /// and the engine replays or reruns it as its record says.
    #[error("answering the broker ({reply:?}) failed: {error}")]
    Reply {
        /// What the door tried to tell the broker.
        reply: Reply,
        /// The client's error.
        error: String,
    },
}

/// A RabbitMQ consumer runner over [`Idempotency::once`]: see the [module docs](self).
/// Cheap to clone; building one needs no connection.
///
/// ```
/// use std::time::Duration;
///
/// use idempotent_runtime::doors::rabbitmq::{KeyFrom, MissingKey, RabbitDoor, ScopeFrom};
/// use idempotent_runtime::store::MemoryStore;
/// use idempotent_runtime::{HandlerConfig, Idempotency};
///
/// let door = RabbitDoor::new(Idempotency::new(MemoryStore::new()))
///     .config(HandlerConfig::new().name("charge"))
///     .key(KeyFrom::Header("order-id".into()))
///     .scope(ScopeFrom::Fixed("orders".into()))
///     .missing_key(MissingKey::RunUnprotected)
///     .retry_delay(Duration::from_millis(500))
///     .concurrency(32);
/// # let _ = door;
/// ```
#[derive(Debug, Clone)]
pub struct RabbitDoor {
    idempotency: Idempotency,
    config: HandlerConfig,
    key: KeySource,
    scope: Arc<ScopeFrom>,
    missing_key: MissingKey,
    retry_delay: Duration,
    concurrency: usize,
}

impl RabbitDoor {
    /// A door over `idempotency` with the defaults: the `message_id` as the key, the
    /// queue as the scope, deliveries without a key rejected, a retry delay of one
    /// second and 16 deliveries handled at once.
    pub fn new(idempotency: Idempotency) -> Self {
        Self {
            idempotency,
            config: HandlerConfig::new(),
            key: KeySource::Property(KeyFrom::MessageId),
            scope: Arc::new(ScopeFrom::Queue),
            missing_key: MissingKey::Reject,
            retry_delay: Duration::from_secs(1),
            concurrency: 16,
        }
    }

    /// The policy each delivery runs under (name, TTL, lease, maximum duration, wait),
    /// as an HTTP handler's.
    pub fn config(mut self, config: HandlerConfig) -> Self {
        self.config = config;
        self
    }

    /// Where a delivery's key comes from (default [`KeyFrom::MessageId`]).
    pub fn key(mut self, key: KeyFrom) -> Self {
        self.key = KeySource::Property(key);
        self
    }

    /// Reads a delivery's key from the delivery itself, in place of a property: `None`
    /// (or an empty key) is a delivery without a key, handled as
    /// [`missing_key`](Self::missing_key) says. The publisher must put the same key in
    /// every copy of a message.
    ///
    /// ```
    /// use idempotent_runtime::Idempotency;
    /// use idempotent_runtime::doors::rabbitmq::RabbitDoor;
    /// use idempotent_runtime::store::MemoryStore;
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Command {
    ///     id: String,
    /// }
    ///
    /// // `{"id": "cmd_1", …}`: keyed by the command's id.
    /// let door = RabbitDoor::new(Idempotency::new(MemoryStore::new())).key_from(|received| {
    ///     let command: Command = serde_json::from_slice(&received.body).ok()?;
    ///     Some(command.id)
    /// });
    /// # let _ = door;
    /// ```
    pub fn key_from<K>(mut self, key: K) -> Self
    where
        K: Fn(&Received) -> Option<String> + Send + Sync + 'static,
    {
        self.key = KeySource::Delivery(Arc::new(key));
        self
    }

    /// Where a delivery's scope comes from (default [`ScopeFrom::Queue`]).
    pub fn scope(mut self, scope: ScopeFrom) -> Self {
        self.scope = Arc::new(scope);
        self
    }

    /// What to do with a delivery without a key (default [`MissingKey::Reject`]).
    pub fn missing_key(mut self, missing: MissingKey) -> Self {
        self.missing_key = missing;
        self
    }

    /// How long a delivery is held before it is requeued after a failure that released
    /// its claim, a store outage or an unconfirmed record (default one second). A
    /// duplicate of a running message is held its lease's time left instead.
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// How many deliveries [`run`](Self::run) handles at once, held ones included
    /// (default 16; at least 1). Keep the channel's prefetch (`basic.qos`) above it.
    pub fn concurrency(mut self, deliveries: usize) -> Self {
        self.concurrency = deliveries.max(1);
        self
    }

    /// Handles `consumer`'s deliveries, each through [`handle`](Self::handle), up to
    /// [`concurrency`](Self::concurrency) at once, until the consumer is cancelled or
    /// its channel closes. A delivery the door cannot answer is logged (RabbitMQ
    /// requeues it when the channel closes); an error reading the consumer is logged
    /// and reading goes on. Dropping the future stops it: each function already running
    /// finishes through the engine (nothing cancels it), and its delivery, unanswered,
    /// is requeued and replayed.
    pub async fn run<F, Fut, T, E>(&self, consumer: lapin::Consumer, function: F)
    where
        F: Fn(IdempotencyKey, Received) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        self.each_delivery(consumer, |delivery, queue| {
            let function = function.clone();
            async move { self.handle(delivery, &queue, function).await.map(drop) }
        })
        .await;
    }

    /// Like [`run`](Self::run), for a function whose writes go to the engine's store's
    /// own database: each delivery through
    /// [`handle_in_transaction`](Self::handle_in_transaction).
    ///
    /// ```no_run
    /// use idempotent_runtime::doors::rabbitmq::RabbitDoor;
    /// use idempotent_runtime::transaction::Tx;
    /// use sqlx::Sqlite;
    ///
    /// # async fn inbox(door: RabbitDoor, consumer: lapin::Consumer) {
    /// // One ledger row per message id, committed with its record before the ack.
    /// door.run_in_transaction(consumer, async |key, received, tx: &mut Tx<Sqlite>| {
    ///     let written = sqlx::query("INSERT INTO ledger (message, body) VALUES (?, ?)")
    ///         .bind(key.as_str().to_owned())
    ///         .bind(received.body)
    ///         .execute(tx.conn())
    ///         .await?;
    ///     Ok::<_, sqlx::Error>(written.rows_affected())
    /// })
    /// .await;
    /// # }
    /// ```
    #[cfg(feature = "sql")]
    pub async fn run_in_transaction<DB, F, T, E>(&self, consumer: lapin::Consumer, function: F)
    where
        DB: TxDatabase,
        F: AsyncFnOnce(IdempotencyKey, Received, &mut Tx<DB>) -> Result<T, E>
            + for<'tx> DeliveryTxFunction<'tx, DB, T, E>
            + Clone
            + Send
            + Sync
            + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        self.each_delivery(consumer, |delivery, queue| {
            let function = function.clone();
            async move {
                self.handle_in_transaction(delivery, &queue, function)
                    .await
                    .map(drop)
            }
        })
        .await;
    }

    /// Reads `consumer`'s deliveries and hands each (with the queue's name) to `each`, up
    /// to [`concurrency`](Self::concurrency) at once, logging what goes wrong.
    async fn each_delivery<H, HFut>(&self, consumer: lapin::Consumer, each: H)
    where
        H: Fn(Delivery, Arc<str>) -> HFut,
        HFut: Future<Output = Result<(), RabbitDoorError>>,
    {
        let queue: Arc<str> = Arc::from(consumer.queue().to_string());
        consumer
            .for_each_concurrent(self.concurrency, |delivery| {
                let handled = delivery.map(|delivery| each(delivery, queue.clone()));
                async move {
                    let handled = match handled {
                        Ok(handled) => handled,
                        Err(err) => {
                            warn!(door = "rabbitmq", error = %err, "reading the consumer failed");
                            return;
                        }
                    };
                    if let Err(err) = handled.await {
                        error!(door = "rabbitmq", error = %err, "delivery not answered; RabbitMQ requeues it when the channel closes");
                    }
                }
            })
            .await;
    }

    /// Handles one delivery from the consumer of `queue`: runs `function` through the
    /// engine under the delivery's key, scope and body, then answers the broker as the
    /// outcome's [`disposition`](Outcome::disposition) says (see the
    /// [module docs](self)); a requeue is held for its delay first.
    ///
    /// # Errors
    ///
    /// Answering the broker failed (RabbitMQ requeues the delivery when the channel
    /// closes).
    pub async fn handle<F, Fut, T, E>(
        &self,
        delivery: Delivery,
        queue: &str,
        function: F,
    ) -> Result<Handled<T, E>, RabbitDoorError>
    where
        F: FnOnce(IdempotencyKey, Received) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let (scope, received, key) = self.read(&delivery, queue);
        let Some(key) = key else {
            return self.without_key(delivery, scope, received, function).await;
        };
        let outcome = self
            .idempotency
            .once(
                &self.config,
                &scope,
                &key,
                Fingerprint::of_payload(&delivery.data),
                move |key| function(key, received),
            )
            .await;
        self.answer_outcome(&delivery, &scope, &key, outcome).await
    }

    /// Like [`handle`](Self::handle), for a function whose writes go to the engine's
    /// store's own database (a transactional inbox): its writes through the `Tx` and the
    /// delivery's record commit together, through
    /// [`Idempotency::once_in_transaction`], before the `basic.ack`; a function's `Err`
    /// rolls them back and the delivery is requeued. Under
    /// [`MissingKey::RunUnprotected`] a delivery without a key runs in a transaction of
    /// its own, committed on `Ok` and rolled back on `Err`, with no record.
    ///
    /// # Errors
    ///
    /// As [`handle`](Self::handle).
    #[cfg(feature = "sql")]
    pub async fn handle_in_transaction<DB, F, T, E>(
        &self,
        delivery: Delivery,
        queue: &str,
        function: F,
    ) -> Result<Handled<T, E>, RabbitDoorError>
    where
        DB: TxDatabase,
        F: AsyncFnOnce(IdempotencyKey, Received, &mut Tx<DB>) -> Result<T, E>
            + for<'tx> DeliveryTxFunction<'tx, DB, T, E>
            + Send
            + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let (scope, received, key) = self.read(&delivery, queue);
        let Some(key) = key else {
            if self.missing_key == MissingKey::Reject {
                return self.reject_keyless(&delivery).await;
            }
            let key = IdempotencyKey::new(scope, format!("tag-{}", delivery.delivery_tag));
            let ran = match super::begin_unprotected::<DB>(&self.idempotency, "rabbitmq").await {
                Some((permit, mut tx)) => {
                    let result = function(key, received, &mut tx).await;
                    super::end_unprotected(permit, tx, result, "rabbitmq").await
                }
                None => None,
            };
            return match ran {
                Some(result) => self.answer_unprotected(&delivery, result).await,
                // No transaction to run it in: delivered again later, never lost.
                None => {
                    let reply = Reply::Requeue(self.retry_delay);
                    answer(&delivery, reply).await?;
                    Ok(Handled::Unrun { reply })
                }
            };
        };
        let outcome = self
            .idempotency
            .once_in_transaction_owned(
                &self.config,
                &scope,
                &key,
                Fingerprint::of_payload(&delivery.data).into(),
                move |key, mut tx: Tx<DB>| async move {
                    let result = function(key, received, &mut tx).await;
                    (result, tx)
                },
            )
            .await;
        self.answer_outcome(&delivery, &scope, &key, outcome).await
    }

    /// A delivery's scope, what the function sees of it, and its key (`None`: it has
    /// none, or an empty one).
    fn read(&self, delivery: &Delivery, queue: &str) -> (String, Received, Option<String>) {
        let scope = match &*self.scope {
            ScopeFrom::Queue => queue.to_owned(),
            ScopeFrom::RoutingKey => delivery.routing_key.to_string(),
            ScopeFrom::Fixed(scope) => scope.clone(),
        };
        let received = Received {
            body: delivery.data.clone(),
            properties: delivery.properties.clone(),
            exchange: delivery.exchange.to_string(),
            routing_key: delivery.routing_key.to_string(),
            redelivered: delivery.redelivered,
        };
        let key = match &self.key {
            KeySource::Property(from) => key_of(from, &delivery.properties),
            KeySource::Delivery(read) => read(&received),
        }
        .filter(|key| !key.is_empty());
        (scope, received, key)
    }

    /// Answers the broker as `outcome`'s disposition says.
    async fn answer_outcome<T, E: fmt::Display>(
        &self,
        delivery: &Delivery,
        scope: &str,
        key: &str,
        outcome: Outcome<T, E>,
    ) -> Result<Handled<T, E>, RabbitDoorError> {
        let reply = match outcome.disposition() {
            Disposition::Acknowledge => Reply::Ack,
            Disposition::Redeliver(after) => Reply::Requeue(after.unwrap_or(self.retry_delay)),
            Disposition::Reject => {
                warn!(
                    door = "rabbitmq",
                    scope, key, "message id reused with another body; rejecting it"
                );
                Reply::Reject
            }
        };
        let (replied, delay) = match reply {
            Reply::Ack => ("acknowledged", None),
            Reply::Requeue(delay) => ("requeued after a delay", Some(delay)),
            Reply::Reject => ("rejected", None),
        };
        super::log_answered("rabbitmq", scope, key, &outcome, replied, delay);
        answer(delivery, reply).await?;
        Ok(Handled::Protected { outcome, reply })
    }

    /// A delivery without a key under [`MissingKey::Reject`]: rejected, nothing run.
    async fn reject_keyless<T, E>(
        &self,
        delivery: &Delivery,
    ) -> Result<Handled<T, E>, RabbitDoorError> {
        error!(
            door = "rabbitmq",
            routing_key = %delivery.routing_key,
            key = ?self.key,
            "delivery without its key; rejecting it (MissingKey::Reject)"
        );
        answer(delivery, Reply::Reject).await?;
        Ok(Handled::MissingKey)
    }

    /// Answers a delivery run unprotected: acknowledged on `Ok`, requeued on `Err`.
    async fn answer_unprotected<T, E: fmt::Display>(
        &self,
        delivery: &Delivery,
        result: Result<T, E>,
    ) -> Result<Handled<T, E>, RabbitDoorError> {
        let reply = match &result {
            Ok(_) => Reply::Ack,
            Err(err) => {
                info!(door = "rabbitmq", error = %err, "unprotected delivery failed; requeued");
                Reply::Requeue(self.retry_delay)
            }
        };
        answer(delivery, reply).await?;
        Ok(Handled::Unprotected { result, reply })
    }

    /// A delivery without a key, as [`MissingKey`] says.
    async fn without_key<F, Fut, T, E>(
        &self,
        delivery: Delivery,
        scope: String,
        received: Received,
        function: F,
    ) -> Result<Handled<T, E>, RabbitDoorError>
    where
        F: FnOnce(IdempotencyKey, Received) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        E: fmt::Display,
    {
        if self.missing_key == MissingKey::Reject {
            return self.reject_keyless(&delivery).await;
        }
        let key = IdempotencyKey::new(scope, format!("tag-{}", delivery.delivery_tag));
        let result = function(key, received).await;
        self.answer_unprotected(&delivery, result).await
    }
}

/// The key `from` names in `properties`, if it is there and not empty.
fn key_of(from: &KeyFrom, properties: &BasicProperties) -> Option<String> {
    let key = match from {
        KeyFrom::MessageId => properties.message_id().as_ref()?.to_string(),
        KeyFrom::Header(name) => {
            let headers = properties.headers().as_ref()?;
            match headers.inner().get(name.as_str())? {
                AMQPValue::LongString(value) => value.to_string(),
                AMQPValue::ShortString(value) => value.to_string(),
                _ => return None,
            }
        }
    };
    (!key.is_empty()).then_some(key)
}

/// Tells the broker `reply`, a requeue after holding the delivery its delay.
async fn answer(delivery: &Delivery, reply: Reply) -> Result<(), RabbitDoorError> {
    let sent = match reply {
        Reply::Ack => delivery.acker.ack(BasicAckOptions::default()).await,
        Reply::Requeue(delay) => {
            tokio::time::sleep(delay).await;
            let requeue = BasicNackOptions {
                requeue: true,
                ..BasicNackOptions::default()
            };
            delivery.acker.nack(requeue).await
        }
        Reply::Reject => {
            delivery
                .acker
                .reject(BasicRejectOptions { requeue: false })
                .await
        }
    };
    sent.map(drop).map_err(|err| RabbitDoorError::Reply {
        reply,
        error: err.to_string(),
    })
}
