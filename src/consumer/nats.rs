//! Charge commands from a NATS JetStream stream: a durable pull consumer whose messages go
//! through [`Charges::handle`], answered as it says.

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, Consumer, pull};
use async_nats::jetstream::{self, AckKind, stream};
use futures_util::StreamExt;

use super::{Charges, Reply};
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
                // Acknowledged only once the record is committed: a lost ack replays.
                let answered = match charges.handle(&message.payload).await {
                    Reply::Acknowledge => message.double_ack().await,
                    Reply::Redeliver(after) => message.ack_with(AckKind::Nak(Some(after))).await,
                    Reply::Reject => message.ack_with(AckKind::Term).await,
                };
                if let Err(error) = answered {
                    tracing::warn!(%error, "message not answered; NATS delivers it again after ack_wait");
                }
            }
        })
        .await;
    tracing::error!("the NATS consumer's message stream ended");
}
