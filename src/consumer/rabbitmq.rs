//! Charge commands from a RabbitMQ queue: its deliveries go through [`Charges::handle`],
//! answered as it says.

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};

use super::{Charges, Reply};
use crate::serve::BoxError;

/// A consumer of a queue, and the connection it lives on (closing it would requeue every
/// delivery not yet acknowledged).
#[derive(Debug)]
pub struct Subscription {
    _connection: Connection,
    consumer: lapin::Consumer,
}

/// A consumer of `queue` (declared if missing) on the RabbitMQ broker at `url`, with a
/// prefetch above `concurrency`: a redelivery is held for its delay before it is
/// requeued, and held deliveries count against the prefetch.
pub async fn subscribe(
    url: &str,
    queue: &str,
    concurrency: usize,
) -> Result<Subscription, BoxError> {
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    let prefetch = u16::try_from(concurrency.saturating_mul(4)).unwrap_or(u16::MAX);
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await?;
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let consumer = channel
        .basic_consume(
            queue.into(),
            "payments-demo".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok(Subscription {
        _connection: connection,
        consumer,
    })
}

/// Handles the subscription's deliveries, `concurrency` at once, until its channel
/// closes.
pub async fn run(subscription: Subscription, charges: Charges, concurrency: usize) {
    let Subscription {
        _connection,
        consumer,
    } = subscription;
    consumer
        .for_each_concurrent(concurrency.max(1), |delivery| {
            let charges = &charges;
            async move {
                let delivery = match delivery {
                    Ok(delivery) => delivery,
                    Err(error) => {
                        tracing::warn!(%error, "reading the RabbitMQ consumer failed");
                        return;
                    }
                };
                // Acknowledged only once the record is committed: a lost ack replays.
                let answered = match charges.handle(&delivery.data).await {
                    Reply::Acknowledge => delivery.acker.ack(BasicAckOptions::default()).await,
                    Reply::Redeliver(after) => {
                        // RabbitMQ has no delayed requeue: hold the delivery, then requeue.
                        tokio::time::sleep(after).await;
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
                if let Err(error) = answered {
                    tracing::warn!(%error, "delivery not answered; RabbitMQ requeues it when the channel closes");
                }
            }
        })
        .await;
    tracing::error!("the RabbitMQ consumer's channel closed");
}
