//! Charge commands from a NATS JetStream stream: a durable pull consumer whose messages go
//! through the library's [`JetStreamDoor`], keyed by the command's id, each running
//! [`Charges::charge_once`] in the transaction its record commits in.

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, Consumer, pull};
use async_nats::jetstream::{self, AckKind, stream};
use futures_util::StreamExt;
use idempotent_runtime::Tx;
use idempotent_runtime::doors::nats::{JetStreamDoor, ScopeFrom};
use idempotent_runtime::transaction::TxDatabase;

use super::{ChargeError, Charges, Dedupe};
use crate::serve::BoxError;

/// The durable consumer every demo process pulls from, so each message goes to one of
/// them (and to another after a crash).
const DURABLE: &str = "charges";

/// The subject the stream `stream` captures: publish charge commands here.
pub fn subject(stream: &str) -> String {
    format!("{stream}.commands")
}

/// The stream `stream` (created if missing, capturing [`subject`]) and its durable
/// consumer on the NATS server at `url`; a message not acknowledged within `ack_wait` (its
/// consumer crashed) is delivered again.
pub async fn subscribe(
    url: &str,
    stream: &str,
    ack_wait: Duration,
) -> Result<Consumer<pull::Config>, BoxError> {
    let jetstream = jetstream::new(async_nats::connect(url).await?);
    let stream = jetstream
        .get_or_create_stream(stream::Config {
            name: stream.to_owned(),
            subjects: vec![subject(stream)],
            ..Default::default()
        })
        .await?;
    let consumer = stream
        .get_or_create_consumer(
            DURABLE,
            pull::Config {
                durable_name: Some(DURABLE.to_owned()),
                ack_policy: AckPolicy::Explicit,
                ack_wait,
                ..Default::default()
            },
        )
        .await?;
    Ok(consumer)
}

/// Handles `consumer`'s messages, `concurrency` at once, until its message stream ends.
pub async fn run(consumer: Consumer<pull::Config>, charges: Charges, concurrency: usize) {
    if charges.dedupe() == Dedupe::Off {
        return every_delivery(consumer, charges, concurrency).await;
    }
    let door = JetStreamDoor::new(charges.idempotency().clone())
        .config(super::CONFIG)
        .key_from(|message| super::command_id(&message.payload))
        .scope(ScopeFrom::Fixed(super::SCOPE.to_owned()))
        .retry_delay(super::RETRY_DELAY)
        .concurrency(concurrency);
    let ran = crate::on_pool!(charges.database(), |pool| once(
        &door,
        &consumer,
        charges.clone(),
        pool
    )
    .await);
    if let Err(error) = ran {
        tracing::error!(%error, "the NATS consumer's messages cannot be read");
        return;
    }
    tracing::error!("the NATS consumer's message stream ended");
}

/// Each command once per id, through `door`, on the store's database (`_pool` names it).
async fn once<DB>(
    door: &JetStreamDoor,
    consumer: &Consumer<pull::Config>,
    charges: Charges,
    _pool: &sqlx::Pool<DB>,
) -> Result<(), idempotent_runtime::doors::nats::NatsDoorError>
where
    DB: TxDatabase,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    door.run_in_transaction(consumer, async move |key, message, tx: &mut Tx<DB>| {
        charges.charge_once(&key, &message.payload, tx).await
    })
    .await
}

/// Every message runs as it comes (`--dedupe off`), as a consumer without the library
/// would: acknowledged once it ran, nak'd when it failed, terminated when it is not a
/// command.
async fn every_delivery(consumer: Consumer<pull::Config>, charges: Charges, concurrency: usize) {
    let messages = match consumer.messages().await {
        Ok(messages) => messages,
        Err(error) => {
            tracing::error!(%error, "the NATS consumer's messages cannot be read");
            return;
        }
    };
    messages
        .for_each_concurrent(concurrency.max(1), |message| {
            let charges = &charges;
            async move {
                let message = match message {
                    Ok(message) => message,
                    Err(error) => {
                        tracing::warn!(%error, "reading the NATS consumer's messages failed");
                        return;
                    }
                };
                let answered = match charges.charge_every_delivery(&message.payload).await {
                    Ok(_) => message.double_ack().await,
                    Err(ChargeError::NotACommand(_)) => message.ack_with(AckKind::Term).await,
                    Err(_) => {
                        let retry = AckKind::Nak(Some(super::RETRY_DELAY));
                        message.ack_with(retry).await
                    }
                };
                if let Err(error) = answered {
                    tracing::warn!(%error, "message not answered; NATS delivers it again after ack_wait");
                }
            }
        })
        .await;
    tracing::error!("the NATS consumer's message stream ended");
}
