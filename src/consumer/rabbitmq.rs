//! Charge commands from a RabbitMQ queue: its deliveries go through the library's
//! [`RabbitDoor`], keyed by the command's id, each running [`Charges::charge_once`] in
//! the transaction its record commits in.

use futures_util::StreamExt;
use idempotent_runtime::Tx;
use idempotent_runtime::doors::rabbitmq::{RabbitDoor, ScopeFrom};
use idempotent_runtime::transaction::TxDatabase;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};

use super::{ChargeError, Charges, Dedupe};
use crate::serve::BoxError;

/// A consumer of a queue, and the connection it lives on (closing it would requeue every
/// delivery not yet acknowledged).
#[derive(Debug)]
pub struct Subscription {
    _connection: Connection,
    consumer: lapin::Consumer,
}

/// A consumer of `queue` (declared if missing) on the RabbitMQ broker at `url`, with a
/// prefetch above `concurrency`: the door holds a redelivery for its delay before it
/// requeues it, and held deliveries count against the prefetch.
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
    if charges.dedupe() == Dedupe::Off {
        every_delivery(consumer, charges, concurrency).await;
    } else {
        let door = RabbitDoor::new(charges.idempotency().clone())
            .config(super::CONFIG)
            .key_from(|received| super::command_id(&received.body))
            .scope(ScopeFrom::Fixed(super::SCOPE.to_owned()))
            .retry_delay(super::RETRY_DELAY)
            .concurrency(concurrency);
        crate::on_pool!(charges.database(), |pool| once(
            &door,
            consumer,
            charges.clone(),
            pool
        )
        .await);
    }
    tracing::error!("the RabbitMQ consumer's channel closed");
}

/// Each command once per id, through `door`, on the store's database (`_pool` names it).
async fn once<DB>(
    door: &RabbitDoor,
    consumer: lapin::Consumer,
    charges: Charges,
    _pool: &sqlx::Pool<DB>,
) where
    DB: TxDatabase,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    door.run_in_transaction(consumer, async move |key, received, tx: &mut Tx<DB>| {
        charges.charge_once(&key, &received.body, tx).await
    })
    .await;
}

/// Every delivery runs as it comes (`--dedupe off`), as a consumer without the library
/// would: acknowledged once it ran, requeued (after a while) when it failed, rejected
/// when it is not a command.
async fn every_delivery(consumer: lapin::Consumer, charges: Charges, concurrency: usize) {
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
                let answered = match charges.charge_every_delivery(&delivery.data).await {
                    Ok(_) => delivery.acker.ack(BasicAckOptions::default()).await,
                    Err(ChargeError::NotACommand(_)) => {
                        let drop = BasicRejectOptions { requeue: false };
                        delivery.acker.reject(drop).await
                    }
                    Err(_) => {
                        // RabbitMQ has no delayed requeue: hold the delivery, then requeue.
                        tokio::time::sleep(super::RETRY_DELAY).await;
                        let requeue = BasicNackOptions {
                            requeue: true,
                            ..BasicNackOptions::default()
                        };
                        delivery.acker.nack(requeue).await
                    }
                };
                if let Err(error) = answered {
                    tracing::warn!(%error, "delivery not answered; RabbitMQ requeues it when the channel closes");
                }
            }
        })
        .await;
}
