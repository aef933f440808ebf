//! The RabbitMQ door ([`RabbitDoor`]) on the real broker: each test its own queue (and
//! dead-letter queue), deleted at its end; effects counted with atomics.
//!
//! Needs `IDEMPOTENT_TEST_RABBITMQ_URL` (e.g. `amqp://guest:guest@127.0.0.1:5672/%2f`);
//! without it every test here is reported ignored.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use idempotent_runtime::doors::rabbitmq::{MissingKey, RabbitDoor, Received, Reply};
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::testing::{Trial, async_trial, ignored_if};
use idempotent_runtime::{HandlerConfig, Idempotency, IdempotencyKey};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::protocol::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties};

const URL_VAR: &str = "IDEMPOTENT_TEST_RABBITMQ_URL";

/// How long a test waits for the consumers to settle before it fails (a broken door
/// fails the test instead of hanging it; a working one settles long before).
const SETTLE_WITHIN: Duration = Duration::from_secs(60);

fn unavailable() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => None,
        _ => Some(format!(
            "{URL_VAR} is not set (e.g. amqp://guest:guest@127.0.0.1:5672/%2f)"
        )),
    }
}

pub(crate) fn trials() -> Vec<Trial> {
    ignored_if(
        unavailable(),
        vec![
            async_trial(
                "a_message_published_twice_runs_once_and_both_are_acked",
                a_message_published_twice_runs_once_and_both_are_acked,
            ),
            async_trial(
                "thirty_two_deliveries_of_one_id_on_two_consumers_run_once",
                thirty_two_deliveries_of_one_id_on_two_consumers_run_once,
            ),
            async_trial(
                "a_failed_function_is_requeued_and_runs_again",
                a_failed_function_is_requeued_and_runs_again,
            ),
            async_trial(
                "a_delivery_without_an_id_is_dead_lettered_or_run_unprotected",
                a_delivery_without_an_id_is_dead_lettered_or_run_unprotected,
            ),
            async_trial(
                "a_redelivered_flag_is_not_taken_for_a_duplicate",
                a_redelivered_flag_is_not_taken_for_a_duplicate,
            ),
            async_trial(
                "without_the_door_a_republished_message_runs_twice",
                without_the_door_a_republished_message_runs_twice,
            ),
        ],
    )
}

/// A queue of this test's own (and `<name>_dl`, its dead-letter queue through the
/// default exchange), on a connection of its own; both deleted by [`TestQueue::delete`].
struct TestQueue {
    connection: Connection,
    publisher: Channel,
    name: String,
}

impl TestQueue {
    async fn new(test: &str) -> Self {
        let url = std::env::var(URL_VAR).unwrap_or_else(|_| panic!("{URL_VAR} is not set"));
        let connection = Connection::connect(&url, ConnectionProperties::default())
            .await
            .expect("connect to RabbitMQ");
        let publisher = connection.create_channel().await.expect("a channel");
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("publisher confirms");
        let name = format!("idem_{test}_{:08x}", rand::random::<u32>());
        let dead_letter = format!("{name}_dl");
        publisher
            .queue_declare(
                dead_letter.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("declare the dead-letter queue");
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        arguments.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(dead_letter.as_str().into()),
        );
        publisher
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions::default(),
                arguments,
            )
            .await
            .expect("declare the test queue");
        Self {
            connection,
            publisher,
            name,
        }
    }

    /// Publishes `body` to the queue with `id` as its `message_id` (none: no id), confirmed
    /// by the broker.
    async fn publish(&self, id: Option<&str>, body: &str) {
        let mut properties = BasicProperties::default();
        if let Some(id) = id {
            properties = properties.with_message_id(id.into());
        }
        self.publisher
            .basic_publish(
                "".into(),
                self.name.as_str().into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                properties,
            )
            .await
            .expect("publish")
            .await
            .expect("the broker's confirm");
    }

    /// A consumer on a channel of its own, with a prefetch of `prefetch`.
    async fn consumer(&self, prefetch: u16) -> lapin::Consumer {
        self.consumer_on(prefetch).await.1
    }

    /// [`consumer`](Self::consumer), and its channel (closing it requeues what the
    /// consumer left unacknowledged).
    async fn consumer_on(&self, prefetch: u16) -> (Channel, lapin::Consumer) {
        let channel = self.connection.create_channel().await.expect("a channel");
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .expect("qos");
        let consumer = channel
            .basic_consume(
                self.name.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume");
        (channel, consumer)
    }

    /// How many messages `queue` holds, ready (not counting deliveries unacknowledged).
    async fn ready(&self, queue: &str) -> u32 {
        self.publisher
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare passively")
            .message_count()
    }

    async fn delete(self) {
        for queue in [format!("{}_dl", self.name), self.name.clone()] {
            let _ = self
                .publisher
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        let _ = self.connection.close(200, "done".into()).await;
    }
}

/// Effects counted by the tests' functions.
#[derive(Default)]
struct Counts {
    /// Calls of the function.
    calls: AtomicUsize,
    /// Deliveries the door acknowledged.
    acked: AtomicUsize,
}

/// Waits (bounded by [`SETTLE_WITHIN`]) until `done` holds.
async fn settle(what: &str, done: impl Fn() -> bool) {
    let waited = tokio::time::timeout(SETTLE_WITHIN, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    assert!(waited.await.is_ok(), "never settled: {what}");
}

/// A door with a short lease and retry delay, on a memory store.
fn door(idempotency: &Idempotency) -> RabbitDoor {
    RabbitDoor::new(idempotency.clone())
        .config(
            HandlerConfig::new()
                .name("charge")
                .lease(Duration::from_secs(2)),
        )
        .retry_delay(Duration::from_millis(100))
}

/// Runs `door` over a consumer of `queue` in a task, counting calls (each taking
/// `takes`) and acknowledged deliveries; the task is aborted when the test ends.
async fn spawn_door(
    queue: &TestQueue,
    door: RabbitDoor,
    counts: Arc<Counts>,
    takes: Duration,
) -> tokio::task::JoinHandle<()> {
    let consumer = queue.consumer(64).await;
    let queue_name = queue.name.clone();
    tokio::spawn(async move {
        consumer
            .for_each_concurrent(32, |delivery| {
                let (door, counts, queue_name) = (door.clone(), counts.clone(), queue_name.clone());
                async move {
                    let delivery = delivery.expect("a delivery");
                    let calls = counts.clone();
                    let handled = door
                        .handle(
                            delivery,
                            &queue_name,
                            move |_key: IdempotencyKey, received: Received| async move {
                                calls.calls.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(takes).await;
                                Ok::<_, String>(received.body.len())
                            },
                        )
                        .await
                        .expect("answered");
                    if handled.reply() == Reply::Ack {
                        counts.acked.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
            .await;
    })
}

/// One message id published twice, through `RabbitDoor::run`: the function runs once,
/// and both deliveries are acknowledged. With a prefetch of one the broker hands out a
/// delivery only once the one before it is acknowledged, so the third message (another
/// id) runs only after both copies were; closing the channel then requeues at most that
/// third one.
async fn a_message_published_twice_runs_once_and_both_are_acked() {
    let queue = TestQueue::new("twice").await;
    let idempotency = Idempotency::new(MemoryStore::new());
    queue.publish(Some("order-1"), "100").await;
    queue.publish(Some("order-1"), "100").await;
    queue.publish(Some("order-1-after"), "101").await;
    let (channel, consumer) = queue.consumer_on(1).await;
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let running = {
        let (door, calls) = (door(&idempotency).concurrency(1), calls.clone());
        tokio::spawn(async move {
            door.run(consumer, move |key, _received| {
                let calls = calls.clone();
                async move {
                    calls.lock().unwrap().push(key.as_str().to_owned());
                    Ok::<_, String>(())
                }
            })
            .await;
        })
    };
    settle("the message after the duplicate ran", || {
        calls.lock().unwrap().len() == 2
    })
    .await;
    running.abort();
    channel
        .close(200, "done".into())
        .await
        .expect("close the channel");
    let name = queue.name.clone();
    let left = queue.ready(&name).await;
    queue.delete().await;
    assert_eq!(*calls.lock().unwrap(), ["order-1", "order-1-after"]);
    assert!(left <= 1, "both copies were acknowledged: {left} ready");
}

/// 32 copies of one message id on two consumers at once: the function runs once; each
/// other delivery is replayed, or held and requeued while the first runs, then replayed.
async fn thirty_two_deliveries_of_one_id_on_two_consumers_run_once() {
    let queue = TestQueue::new("storm").await;
    let counts = Arc::new(Counts::default());
    let idempotency = Idempotency::new(MemoryStore::new());
    for _ in 0..32 {
        queue.publish(Some("order-2"), "200").await;
    }
    let takes = Duration::from_millis(300);
    let first = spawn_door(&queue, door(&idempotency), counts.clone(), takes).await;
    let second = spawn_door(&queue, door(&idempotency), counts.clone(), takes).await;
    settle("32 deliveries acknowledged", || {
        counts.acked.load(Ordering::SeqCst) == 32
    })
    .await;
    first.abort();
    second.abort();
    assert_eq!(counts.calls.load(Ordering::SeqCst), 1);
    queue.delete().await;
}

/// A function that fails releases its claim: the delivery is requeued after the retry
/// delay and runs again, once more, successfully.
async fn a_failed_function_is_requeued_and_runs_again() {
    let queue = TestQueue::new("fails").await;
    let idempotency = Idempotency::new(MemoryStore::new());
    queue.publish(Some("order-3"), "300").await;
    let (calls, done) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut consumer = queue.consumer(8).await;
    let door = door(&idempotency);
    let name = queue.name.clone();
    let task = {
        let (calls, done) = (calls.clone(), done.clone());
        tokio::spawn(async move {
            while let Some(delivery) = consumer.next().await {
                let calls = calls.clone();
                let handled = door
                    .handle(
                        delivery.expect("a delivery"),
                        &name,
                        move |_key, _received| async move {
                            match calls.fetch_add(1, Ordering::SeqCst) {
                                0 => Err("the gateway timed out".to_owned()),
                                _ => Ok(1_u8),
                            }
                        },
                    )
                    .await
                    .expect("answered");
                if handled.reply() == Reply::Ack {
                    done.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
    };
    settle("acknowledged after a retry", || {
        done.load(Ordering::SeqCst) == 1
    })
    .await;
    task.abort();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    queue.delete().await;
}

/// A delivery without a `message_id`: rejected to the queue's dead-letter queue by
/// default, nothing run; run (unprotected) under `MissingKey::RunUnprotected`.
async fn a_delivery_without_an_id_is_dead_lettered_or_run_unprotected() {
    let queue = TestQueue::new("noid").await;
    let idempotency = Idempotency::new(MemoryStore::new());
    let counts = Arc::new(Counts::default());
    queue.publish(None, "400").await;
    let rejecting = spawn_door(&queue, door(&idempotency), counts.clone(), Duration::ZERO).await;
    let dead_letter = format!("{}_dl", queue.name);
    let mut dead_lettered = 0;
    for _ in 0..500 {
        dead_lettered = queue.ready(&dead_letter).await;
        if dead_lettered == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rejecting.abort();
    assert_eq!(dead_lettered, 1, "dead-lettered");
    assert_eq!(counts.calls.load(Ordering::SeqCst), 0, "nothing ran");

    let unprotected = door(&idempotency).missing_key(MissingKey::RunUnprotected);
    queue.publish(None, "400").await;
    let running = spawn_door(&queue, unprotected, counts.clone(), Duration::ZERO).await;
    settle("run unprotected", || {
        counts.calls.load(Ordering::SeqCst) == 1
    })
    .await;
    running.abort();
    queue.delete().await;
}

/// A delivery RabbitMQ marks `redelivered` (a plain consumer nacked it first, without
/// running anything) still runs: the flag is a hint, and the record decides.
async fn a_redelivered_flag_is_not_taken_for_a_duplicate() {
    let queue = TestQueue::new("redelivered").await;
    let idempotency = Idempotency::new(MemoryStore::new());
    queue.publish(Some("order-5"), "500").await;
    let mut plain = queue.consumer(1).await;
    let first = plain.next().await.expect("a delivery").expect("a delivery");
    assert!(!first.redelivered);
    first
        .acker
        .nack(BasicNackOptions {
            requeue: true,
            ..BasicNackOptions::default()
        })
        .await
        .expect("nack");
    let again = plain.next().await.expect("a delivery").expect("a delivery");
    assert!(again.redelivered, "RabbitMQ marks the requeued delivery");
    let ran = Arc::new(AtomicUsize::new(0));
    let counter = ran.clone();
    let handled = door(&idempotency)
        .handle(
            again,
            &queue.name,
            move |_key, received: Received| async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(received.redelivered)
            },
        )
        .await
        .expect("answered");
    assert_eq!(handled.reply(), Reply::Ack);
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    queue.delete().await;
}

/// The control: a plain consumer that acks what it runs runs a message published twice
/// twice — what the door's tests above would see without it.
async fn without_the_door_a_republished_message_runs_twice() {
    let queue = TestQueue::new("plain").await;
    queue.publish(Some("order-6"), "600").await;
    queue.publish(Some("order-6"), "600").await;
    let mut plain = queue.consumer(8).await;
    let mut ran = 0;
    for _ in 0..2 {
        let delivery = tokio::time::timeout(SETTLE_WITHIN, plain.next())
            .await
            .expect("a delivery in time")
            .expect("a delivery")
            .expect("a delivery");
        ran += 1;
        delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .expect("ack");
    }
    assert_eq!(ran, 2);
    queue.delete().await;
}
