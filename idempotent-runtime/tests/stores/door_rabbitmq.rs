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
    let mut trials = ignored_if(
        unavailable(),
        vec![
            async_trial(
                "a_key_read_from_the_body_dedupes_and_a_body_without_it_is_rejected",
                a_key_read_from_the_body_dedupes_and_a_body_without_it_is_rejected,
            ),
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
            #[cfg(feature = "sqlite")]
            async_trial(
                "the_inbox_writes_each_message_once_on_sqlite",
                inbox::on_sqlite,
            ),
        ],
    );
    #[cfg(feature = "postgres")]
    {
        let postgres_unavailable =
            unavailable().or_else(|| match std::env::var(inbox::POSTGRES_URL_VAR) {
                Ok(url) if !url.is_empty() => None,
                _ => Some(format!("{} is not set", inbox::POSTGRES_URL_VAR)),
            });
        trials.extend(ignored_if(
            postgres_unavailable,
            vec![async_trial(
                "the_inbox_writes_each_message_once_on_postgres",
                inbox::on_postgres,
            )],
        ));
    }
    trials
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
    close(&channel).await;
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

/// Closes `channel`, so the broker requeues what it left unacknowledged. The aborted
/// door's consumer may have begun closing it already (its cancel races this close): a
/// channel closing or closed is fine.
async fn close(channel: &lapin::Channel) {
    match channel.close(200, "done".into()).await {
        Ok(()) => {}
        Err(error)
            if matches!(
                error.kind(),
                lapin::ErrorKind::InvalidChannelState(
                    lapin::ChannelState::Closing | lapin::ChannelState::Closed,
                    _
                )
            ) => {}
        Err(error) => panic!("close the channel: {error:?}"),
    }
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

/// The key read from the body (`{"id": …}`, [`RabbitDoor::key_from`]), no `message_id`
/// at all: two copies of one command run once and both are acknowledged, and a body
/// without an id follows `MissingKey` (rejected to the dead-letter queue, nothing run).
/// With a prefetch of one the broker hands out a delivery only once the one before it is
/// answered, so when the last command (another id) runs, the three before it were.
async fn a_key_read_from_the_body_dedupes_and_a_body_without_it_is_rejected() {
    let queue = TestQueue::new("bodykey").await;
    let idempotency = Idempotency::new(MemoryStore::new());
    let command = r#"{"id":"cmd_1","amount":100}"#;
    queue.publish(None, command).await;
    queue.publish(None, command).await;
    queue.publish(None, r#"{"amount":200}"#).await;
    queue.publish(None, r#"{"id":"cmd_2","amount":300}"#).await;
    let (channel, consumer) = queue.consumer_on(1).await;
    let keys = Arc::new(std::sync::Mutex::new(Vec::new()));
    let running = {
        let keys = keys.clone();
        let door = door(&idempotency).concurrency(1).key_from(|received| {
            let body: serde_json::Value = serde_json::from_slice(&received.body).ok()?;
            Some(body.get("id")?.as_str()?.to_owned())
        });
        tokio::spawn(async move {
            door.run(consumer, move |key, _received| {
                let keys = keys.clone();
                async move {
                    keys.lock().unwrap().push(key.as_str().to_owned());
                    Ok::<_, String>(())
                }
            })
            .await;
        })
    };
    settle("the last command ran", || keys.lock().unwrap().len() == 2).await;
    running.abort();
    close(&channel).await;
    let name = queue.name.clone();
    let left = queue.ready(&name).await;
    let dead_lettered = queue.ready(&format!("{name}_dl")).await;
    queue.delete().await;
    assert_eq!(
        *keys.lock().unwrap(),
        ["cmd_1", "cmd_2"],
        "one run per body's id"
    );
    assert_eq!(dead_lettered, 1, "the body without an id is rejected");
    assert!(
        left <= 1,
        "both copies of cmd_1 were acknowledged: {left} ready"
    );
}

/// The inbox ([`RabbitDoor::handle_in_transaction`]) on a store's own database: 16 copies
/// of one id and one of another, on two consumers at once, write one ledger row each, in
/// the transaction their record commits in, and every delivery is acknowledged; a
/// function that fails after writing has its row rolled back and is requeued, then
/// writes it once. Effects are counted in the table.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod inbox {
    use super::*;
    use idempotent_runtime::transaction::{Tx, TxDatabase};

    /// The Postgres server the Postgres trial needs.
    #[cfg(feature = "postgres")]
    pub(super) const POSTGRES_URL_VAR: &str = "IDEMPOTENT_TEST_POSTGRES_URL";

    /// The inbox over an SQLite store in a temporary file.
    #[cfg(feature = "sqlite")]
    pub(super) async fn on_sqlite() {
        use idempotent_runtime::store::SqliteStore;

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("inbox.db");
        let store = SqliteStore::connect(path.to_str().expect("utf-8"))
            .await
            .expect("open the SQLite store");
        let pool = store.pool().clone();
        sqlx::query("CREATE TABLE ledger (message TEXT NOT NULL, cents BIGINT NOT NULL)")
            .execute(&pool)
            .await
            .expect("create the ledger");
        writes_each_message_once::<sqlx::Sqlite>(
            Idempotency::new(store),
            "INSERT INTO ledger VALUES (?, ?)",
        )
        .await;
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT message, cents FROM ledger ORDER BY message")
                .fetch_all(&pool)
                .await
                .expect("the ledger");
        assert_eq!(rows, expected_rows(), "one row per message");
    }

    /// The inbox over a Postgres store, in a schema of its own (`idem_test_…`, like the
    /// Postgres store tests), dropped afterwards.
    #[cfg(feature = "postgres")]
    pub(super) async fn on_postgres() {
        use idempotent_runtime::store::PostgresStore;

        let url = std::env::var(POSTGRES_URL_VAR).expect("the URL is set");
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let schema = format!("idem_test_{secs}_{:016x}", rand::random::<u64>());
        let store = PostgresStore::connect_in_schema(&url, &schema)
            .await
            .unwrap_or_else(|e| panic!("{POSTGRES_URL_VAR} is set but unreachable: {e}"));
        let pool = store.pool().clone();
        // Named in the test's schema: the pool's connections need not search it first.
        let ledger = format!("\"{schema}\".ledger");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE {ledger} (message TEXT NOT NULL, cents BIGINT NOT NULL)"
        )))
        .execute(&pool)
        .await
        .expect("create the ledger");
        writes_each_message_once::<sqlx::Postgres>(
            Idempotency::new(store),
            &format!("INSERT INTO {ledger} VALUES ($1, $2)"),
        )
        .await;
        let rows: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT message, cents FROM {ledger} ORDER BY message"
        )))
        .fetch_all(&pool)
        .await
        .expect("the ledger");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
        )))
        .execute(&pool)
        .await
        .expect("drop the test schema");
        pool.close().await;
        assert_eq!(rows, expected_rows(), "one row per message");
    }

    fn expected_rows() -> Vec<(String, i64)> {
        vec![("order-1".to_owned(), 100), ("order-2".to_owned(), 200)]
    }

    /// Publishes the messages, runs two consumers until all 17 deliveries are
    /// acknowledged, and checks the failing message ran again; the caller counts the rows
    /// `insert` wrote.
    async fn writes_each_message_once<DB>(idempotency: Idempotency, insert: &str)
    where
        DB: TxDatabase,
        for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
        DB::Arguments: sqlx::IntoArguments<DB>,
        for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        let queue = TestQueue::new("inbox").await;
        for _ in 0..16 {
            queue.publish(Some("order-1"), "100").await;
        }
        queue.publish(Some("order-2"), "200").await;
        let insert: Arc<str> = Arc::from(insert);
        let acked = Arc::new(AtomicUsize::new(0));
        // order-2's first run fails after its write.
        let failed_once = Arc::new(AtomicUsize::new(0));
        let door = RabbitDoor::new(idempotency)
            .config(
                HandlerConfig::new()
                    .name("ledger")
                    .wait(Duration::from_secs(20)),
            )
            .retry_delay(Duration::from_millis(50));
        let mut consumers = Vec::new();
        for _ in 0..2 {
            let consumer = queue.consumer(16).await;
            let (door, acked, failed_once) = (door.clone(), acked.clone(), failed_once.clone());
            let (queue_name, insert) = (queue.name.clone(), insert.clone());
            consumers.push(async move {
                consumer
                    .for_each_concurrent(8, |delivery| {
                        let (door, acked, failed_once) =
                            (door.clone(), acked.clone(), failed_once.clone());
                        let (queue_name, insert) = (queue_name.clone(), insert.clone());
                        async move {
                            let handled = door
                                .handle_in_transaction(
                                    delivery.expect("a delivery"),
                                    &queue_name,
                                    async move |key, received, tx: &mut Tx<DB>| {
                                        let cents: i64 = String::from_utf8_lossy(&received.body)
                                            .parse()
                                            .expect("cents");
                                        sqlx::query::<DB>(sqlx::AssertSqlSafe(insert.to_string()))
                                            .bind(key.as_str().to_owned())
                                            .bind(cents)
                                            .execute(tx.conn())
                                            .await
                                            .map_err(|err| err.to_string())?;
                                        if key.as_str() == "order-2"
                                            && failed_once.fetch_add(1, Ordering::SeqCst) == 0
                                        {
                                            return Err("the gateway timed out".to_owned());
                                        }
                                        Ok(cents)
                                    },
                                )
                                .await
                                .expect("answered");
                            if handled.reply() == Reply::Ack {
                                acked.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    })
                    .await;
            });
        }
        // Polled here rather than spawned: a future generic over the database is not
        // provably `Send`; the two consumers' deliveries still run interleaved.
        let all = futures_util::future::join_all(consumers);
        tokio::select! {
            _ = all => panic!("the consumers stopped"),
            () = settle("17 deliveries acknowledged", || {
                acked.load(Ordering::SeqCst) == 17
            }) => {}
        }
        queue.delete().await;
        assert!(
            failed_once.load(Ordering::SeqCst) >= 2,
            "order-2 ran again after its failure"
        );
    }
}
