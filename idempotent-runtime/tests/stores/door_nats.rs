//! The NATS JetStream door ([`JetStreamDoor`]) on the real server: each test its own
//! stream (and dead-letter stream), deleted at its end; effects counted with atomics.
//!
//! Needs `IDEMPOTENT_TEST_NATS_URL` (e.g. `nats://127.0.0.1:4222`, a server with
//! JetStream); without it every test here is reported ignored.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, Consumer, pull};
use async_nats::jetstream::{self, Context, stream};
use futures_util::StreamExt;
use idempotent_runtime::clock::ManualClock;
use idempotent_runtime::doors::nats::{
    Handled, JetStreamDoor, MissingKey, ORIGINAL_SUBJECT_HEADER, REJECTED_HEADER, Reply,
};
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::testing::faults::{Fault, Faulty, Operation};
use idempotent_runtime::testing::{Trial, async_trial, ignored_if};
use idempotent_runtime::{HandlerConfig, Idempotency, IdempotencyKey, Outcome, Store};

const URL_VAR: &str = "IDEMPOTENT_TEST_NATS_URL";

/// How long a test waits for the consumer to settle before it fails (a broken door
/// fails the test instead of hanging it; a working one settles long before).
const SETTLE_WITHIN: Duration = Duration::from_secs(60);

/// The test streams' duplicate window: short, so that a test can publish one id again
/// beyond it.
const DUPLICATE_WINDOW: Duration = Duration::from_millis(100);

/// The key header the tests that publish one id many times at once use: the server does
/// not dedupe by it (it does by `Nats-Msg-Id`, within its window), so they need not wait
/// out the window between publishes.
const ORDER_ID: &str = "Order-Id";

fn unavailable() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => None,
        _ => Some(format!(
            "{URL_VAR} is not set (e.g. nats://127.0.0.1:4222, a server with JetStream)"
        )),
    }
}

/// A stream of this test's own (`<name>` capturing `<name>.>`), and a dead-letter stream
/// beside it (`<name>_DL` capturing `<name>_dl`); both deleted when dropped.
struct TestStream {
    jetstream: Context,
    name: String,
}

impl TestStream {
    async fn new(test: &str) -> Self {
        let url = std::env::var(URL_VAR).unwrap_or_else(|_| panic!("{URL_VAR} is not set"));
        let client = async_nats::connect(url).await.expect("connect to NATS");
        let jetstream = jetstream::new(client);
        let name = format!("IDEM_{test}_{:08x}", rand::random::<u32>()).to_uppercase();
        jetstream
            .create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![format!("{name}.>")],
                // Short, so that a test can publish one id again beyond it (each publish
                // is checked not to have been taken for a duplicate by the server).
                duplicate_window: DUPLICATE_WINDOW,
                ..Default::default()
            })
            .await
            .expect("create the test stream");
        jetstream
            .create_stream(stream::Config {
                name: format!("{name}_DL"),
                subjects: vec![format!("{name}_dl")],
                ..Default::default()
            })
            .await
            .expect("create the dead-letter stream");
        Self { jetstream, name }
    }

    fn subject(&self) -> String {
        format!("{}.orders", self.name)
    }

    fn dead_letter(&self) -> String {
        format!("{}_dl", self.name)
    }

    /// Publishes `payload` with `id` as its `Nats-Msg-Id` (none: no id), and checks that
    /// the server stored it as a new message.
    async fn publish(&self, id: Option<&str>, payload: &str) {
        self.publish_with(id.map(|id| ("Nats-Msg-Id", id)), payload)
            .await;
    }

    /// Publishes `payload` with `header` (a name and a value), and checks that the
    /// server stored it as a new message.
    async fn publish_with(&self, header: Option<(&str, &str)>, payload: &str) {
        let mut headers = HeaderMap::new();
        if let Some((name, value)) = header {
            headers.insert(name, value);
        }
        let ack = self
            .jetstream
            .publish_with_headers(self.subject(), headers, payload.to_owned().into())
            .await
            .expect("publish")
            .await
            .expect("the server's publish ack");
        assert!(
            !ack.duplicate,
            "the server deduplicated the publish itself; the test needs it stored"
        );
    }

    /// Publishes `id` `times` times, each beyond the stream's duplicate window.
    async fn publish_again_and_again(&self, id: &str, payload: &str, times: usize) {
        for _ in 0..times {
            self.publish(Some(id), payload).await;
            // Past the server's duplicate window (checked by `publish`).
            tokio::time::sleep(DUPLICATE_WINDOW * 2).await;
        }
    }

    async fn consumer(&self, name: &str, ack_wait: Duration) -> Consumer<pull::Config> {
        self.jetstream
            .get_stream(&self.name)
            .await
            .expect("the test stream")
            .create_consumer(pull::Config {
                durable_name: Some(name.to_owned()),
                ack_policy: AckPolicy::Explicit,
                ack_wait,
                ..Default::default()
            })
            .await
            .expect("create the consumer")
    }

    /// Waits until `consumer` has every one of the stream's `published` messages
    /// answered for good (acked or terminated) and nothing pending; fails the test after
    /// [`SETTLE_WITHIN`].
    async fn settled(&self, consumer: &Consumer<pull::Config>, published: u64) {
        let started = tokio::time::Instant::now();
        loop {
            let info = consumer.get_info().await.expect("consumer info");
            if info.ack_floor.stream_sequence >= published
                && info.num_ack_pending == 0
                && info.num_pending == 0
            {
                return;
            }
            assert!(
                started.elapsed() < SETTLE_WITHIN,
                "the consumer did not settle: {info:?}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Deletes the test's streams (a failed test leaves them, to look at).
    async fn delete(self) {
        let _ = self.jetstream.delete_stream(&self.name).await;
        let _ = self
            .jetstream
            .delete_stream(format!("{}_DL", self.name))
            .await;
    }

    /// The dead-letter stream's messages.
    async fn dead_letters(&self) -> Vec<async_nats::jetstream::message::StreamMessage> {
        let stream = self
            .jetstream
            .get_stream(format!("{}_DL", self.name))
            .await
            .expect("the dead-letter stream");
        let last = stream.get_info().await.expect("info").state.last_sequence;
        let mut messages = Vec::new();
        for sequence in 1..=last {
            messages.push(stream.get_raw_message(sequence).await.expect("a message"));
        }
        messages
    }
}

/// Runs `door` over `consumer` in the background until the guard is dropped; the
/// function counts its runs in `runs` and holds each run for `hold`.
fn spawn_runner(
    door: JetStreamDoor,
    consumer: Consumer<pull::Config>,
    runs: Arc<AtomicUsize>,
    hold: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let _ = door
            .run(&consumer, move |_key, message| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    if !hold.is_zero() {
                        tokio::time::sleep(hold).await;
                    }
                    Ok::<_, String>(String::from_utf8_lossy(&message.payload).into_owned())
                }
            })
            .await;
    })
}

fn engine() -> Idempotency {
    Idempotency::new(MemoryStore::new())
}

/// One message published twice with the same `Nats-Msg-Id`, beyond the stream's own
/// duplicate window: the server stores both, the door runs the function once and
/// acknowledges both.
async fn check_published_twice_runs_once_and_both_are_acked() {
    let test = TestStream::new("twice").await;
    test.publish_again_and_again("order-1", "charge 1999", 2)
        .await;
    let consumer = test.consumer("charger", Duration::from_secs(30)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let runner = spawn_runner(
        JetStreamDoor::new(engine()),
        consumer.clone(),
        runs.clone(),
        Duration::ZERO,
    );
    test.settled(&consumer, 2).await;
    runner.abort();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the function ran twice");
    let info = consumer.get_info().await.expect("info");
    assert_eq!(
        info.num_redelivered, 0,
        "both were acked at their first delivery"
    );
    test.delete().await;
}

/// The same two publishes through a consumer whose protection is off (the key header it
/// reads is never there, and keyless messages run unprotected): the effect happens
/// twice. The dedupe of the test above is the door's, not the server's.
async fn check_without_the_door_the_effect_happens_twice() {
    let test = TestStream::new("unprotected").await;
    test.publish_again_and_again("order-1", "charge 1999", 2)
        .await;
    let consumer = test.consumer("charger", Duration::from_secs(30)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let door = JetStreamDoor::new(engine())
        .key_header("X-Protection-Off")
        .missing_key(MissingKey::RunUnprotected);
    let runner = spawn_runner(door, consumer.clone(), runs.clone(), Duration::ZERO);
    test.settled(&consumer, 2).await;
    runner.abort();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "unprotected, each copy runs"
    );
    test.delete().await;
}

/// 32 deliveries of one id (in a key header of the application's), handled by four runners on one durable consumer (several
/// consumer processes), each handling eight messages at once: the function runs once;
/// the duplicates wait for it and are acknowledged with its replay.
async fn check_thirty_two_deliveries_of_one_id_run_once() {
    let test = TestStream::new("dup32").await;
    for _ in 0..32 {
        test.publish_with(Some((ORDER_ID, "order-32")), "charge 32")
            .await;
    }
    let consumer = test.consumer("charger", Duration::from_secs(30)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let idempotency = engine();
    const WAITING: HandlerConfig = HandlerConfig::new()
        .name("charge")
        .wait(Duration::from_secs(20));
    let runners: Vec<_> = (0..4)
        .map(|_| {
            let door = JetStreamDoor::new(idempotency.clone())
                .key_header(ORDER_ID)
                .config(WAITING)
                .concurrency(8);
            // Each run holds a while, so the deliveries overlap it.
            spawn_runner(
                door,
                consumer.clone(),
                runs.clone(),
                Duration::from_millis(300),
            )
        })
        .collect();
    test.settled(&consumer, 32).await;
    for runner in runners {
        runner.abort();
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the function ran more than once"
    );
    test.delete().await;
}

/// A message whose function fails is nak'd (its claim released), delivered again, and
/// then runs: the effect happens once, on the second delivery.
async fn check_a_failed_message_is_redelivered_then_runs() {
    let test = TestStream::new("retry").await;
    test.publish(Some("order-7"), "charge 7").await;
    let consumer = test.consumer("charger", Duration::from_secs(30)).await;
    let (attempts, effects) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let door = JetStreamDoor::new(engine()).retry_delay(Duration::from_millis(50));
    let runner = tokio::spawn({
        let (attempts, effects) = (attempts.clone(), effects.clone());
        let consumer = consumer.clone();
        async move {
            let _ = door
                .run(&consumer, move |_key, _message| {
                    let (attempts, effects) = (attempts.clone(), effects.clone());
                    async move {
                        if attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                            return Err("the gateway timed out".to_owned());
                        }
                        effects.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    }
                })
                .await;
        }
    });
    test.settled(&consumer, 1).await;
    runner.abort();
    assert_eq!(attempts.load(Ordering::SeqCst), 2, "failed once, then ran");
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    let info = consumer.get_info().await.expect("info");
    assert_eq!(info.delivered.consumer_sequence, 2, "delivered twice");
    test.delete().await;
}

/// A message without an id under `MissingKey::Terminate` with a dead-letter subject: it
/// is published there (headers say why and from where) and terminated; nothing runs.
/// Under `MissingKey::RunUnprotected` each copy runs.
async fn check_a_message_without_an_id_is_handled_as_configured() {
    let test = TestStream::new("noid").await;
    test.publish(None, "no id here").await;
    let consumer = test.consumer("charger", Duration::from_secs(30)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let door = JetStreamDoor::new(engine()).dead_letter(&test.dead_letter());
    let runner = spawn_runner(door, consumer.clone(), runs.clone(), Duration::ZERO);
    test.settled(&consumer, 1).await;
    runner.abort();
    assert_eq!(runs.load(Ordering::SeqCst), 0, "ran without an id");
    let dead = test.dead_letters().await;
    assert_eq!(dead.len(), 1, "one dead letter");
    assert_eq!(dead[0].payload, "no id here");
    let headers = &dead[0].headers;
    assert_eq!(
        headers.get_last(REJECTED_HEADER).map(|v| v.as_str()),
        Some("the message has no key")
    );
    assert_eq!(
        headers
            .get_last(ORIGINAL_SUBJECT_HEADER)
            .map(|v| v.as_str()),
        Some(test.subject().as_str())
    );

    let unprotected = test.consumer("unprotected", Duration::from_secs(30)).await;
    test.publish(None, "no id again").await;
    let runner = spawn_runner(
        JetStreamDoor::new(engine()).missing_key(MissingKey::RunUnprotected),
        unprotected.clone(),
        runs.clone(),
        Duration::ZERO,
    );
    test.settled(&unprotected, 2).await;
    runner.abort();
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each keyless message ran");
    test.delete().await;
}

/// The key read from the payload (`{"id": …}`, [`JetStreamDoor::key_from`]), no header
/// at all: two copies of one command run once and both are acknowledged, and a payload
/// without an id follows `MissingKey` (terminated and dead-lettered, nothing run).
async fn check_a_key_read_from_the_payload_dedupes_and_one_without_it_is_terminated() {
    let test = TestStream::new("bodykey").await;
    let command = r#"{"id":"cmd_1","amount":100}"#;
    test.publish(None, command).await;
    test.publish(None, command).await;
    test.publish(None, r#"{"amount":200}"#).await;
    let consumer = test.consumer("charger", Duration::from_secs(30)).await;
    let keys = Arc::new(std::sync::Mutex::new(Vec::new()));
    let door = JetStreamDoor::new(engine())
        .key_from(|message| {
            let body: serde_json::Value = serde_json::from_slice(&message.payload).ok()?;
            Some(body.get("id")?.as_str()?.to_owned())
        })
        .dead_letter(&test.dead_letter());
    let runner = {
        let (keys, consumer) = (keys.clone(), consumer.clone());
        tokio::spawn(async move {
            let _ = door
                .run(&consumer, move |key, _message| {
                    let keys = keys.clone();
                    async move {
                        keys.lock().unwrap().push(key.as_str().to_owned());
                        Ok::<_, String>(())
                    }
                })
                .await;
        })
    };
    test.settled(&consumer, 3).await;
    runner.abort();
    assert_eq!(
        *keys.lock().unwrap(),
        ["cmd_1"],
        "one run, under the body's id"
    );
    let info = consumer.get_info().await.expect("info");
    assert_eq!(
        info.num_redelivered, 0,
        "each answered at its first delivery"
    );
    let dead = test.dead_letters().await;
    assert_eq!(dead.len(), 1, "the payload without an id is dead-lettered");
    assert_eq!(dead[0].payload, r#"{"amount":200}"#);
    test.delete().await;
}

/// A dead-letter subject the consumer itself reads (a misconfiguration): a keyless
/// message on it is terminated, not published again, so nothing loops.
async fn check_a_dead_letter_that_comes_back_is_not_published_again() {
    let test = TestStream::new("loop").await;
    test.publish(None, "no id").await;
    let consumer = test.consumer("charger", Duration::from_secs(30)).await;
    let door = JetStreamDoor::new(engine()).dead_letter(&test.subject());
    let message = fetch(&consumer, 1).await.remove(0);
    let handled = door
        .handle(message, |_key, _message| async { Ok::<_, String>(()) })
        .await
        .expect("answered");
    assert!(
        matches!(
            handled,
            Handled::MissingKey {
                reply: Reply::Term,
                dead_lettered: false
            }
        ),
        "{handled:?}"
    );
    let stream = test
        .jetstream
        .get_stream(&test.name)
        .await
        .expect("the test stream");
    let messages = stream.get_info().await.expect("info").state.messages;
    assert_eq!(
        messages, 1,
        "the dead letter was published back into the stream"
    );
    test.settled(&consumer, 1).await;
    test.delete().await;
}

/// Fetches the next `n` messages of `consumer`.
async fn fetch(consumer: &Consumer<pull::Config>, n: usize) -> Vec<jetstream::Message> {
    let mut batch = consumer
        .fetch()
        .max_messages(n)
        .expires(Duration::from_secs(5))
        .messages()
        .await
        .expect("fetch");
    let mut messages = Vec::new();
    while let Some(message) = batch.next().await {
        messages.push(message.expect("a message"));
    }
    assert_eq!(messages.len(), n, "fetched");
    messages
}

/// A delivery of a message whose first delivery is still running is nak'd with a delay
/// of the lease's time left, and runs nothing; the same id with another payload is
/// terminated and dead-lettered.
async fn check_a_duplicate_of_a_running_message_is_nakd_with_the_lease_left() {
    let test = TestStream::new("running").await;
    test.publish_with(Some((ORDER_ID, "order-9")), "charge 9")
        .await;
    test.publish_with(Some((ORDER_ID, "order-9")), "charge 9")
        .await;
    test.publish_with(Some((ORDER_ID, "order-9")), "charge 10 (another payload)")
        .await;
    let consumer = test.consumer("charger", Duration::from_secs(30)).await;
    let lease = Duration::from_secs(20);
    let door = JetStreamDoor::new(
        Idempotency::builder(MemoryStore::new())
            .default_lease(lease)
            .build(),
    )
    .key_header(ORDER_ID)
    .dead_letter(&test.dead_letter());
    let mut messages = fetch(&consumer, 3).await.into_iter();
    let (first, second, reused) = (
        messages.next().unwrap(),
        messages.next().unwrap(),
        messages.next().unwrap(),
    );
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let release = Arc::new(tokio::sync::Notify::new());
    let original = tokio::spawn({
        let (door, release) = (door.clone(), release.clone());
        async move {
            door.handle(first, move |_key, _message| async move {
                let _ = started_tx.send(());
                release.notified().await;
                Ok::<_, String>(1u32)
            })
            .await
        }
    });
    started.await.expect("the first delivery runs");
    let runs = Arc::new(AtomicUsize::new(0));
    let duplicate = door
        .handle(second, {
            let runs = runs.clone();
            move |_key, _message| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(2u32)
            }
        })
        .await
        .expect("answered");
    match duplicate {
        Handled::Protected {
            outcome: Outcome::InProgress { retry_after },
            reply: Reply::Nak(delay),
            ..
        } => {
            assert_eq!(delay, retry_after);
            assert!(
                delay >= Duration::from_secs(1) && delay <= lease,
                "{delay:?}"
            );
        }
        other => panic!("expected a nak as in progress, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "ran alongside the original");
    release.notify_one();
    match original.await.unwrap().expect("answered") {
        Handled::Protected {
            outcome: Outcome::Ran(1),
            reply: Reply::Ack,
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    let rejected = door
        .handle(reused, |_key, _message| async { Ok::<_, String>(3u32) })
        .await
        .expect("answered");
    match rejected {
        Handled::Protected {
            outcome: Outcome::KeyReused,
            reply: Reply::Term,
            dead_lettered: true,
        } => {}
        other => panic!("expected the reused id terminated, got {other:?}"),
    }
    let dead = test.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].payload, "charge 10 (another payload)");
    test.delete().await;
}

/// A store outage: the message is nak'd after the door's retry delay and nothing runs;
/// once the store is back, its next delivery runs and is acknowledged.
async fn check_a_store_outage_naks_and_runs_nothing() {
    let test = TestStream::new("outage").await;
    test.publish(Some("order-5"), "charge 5").await;
    let consumer = test.consumer("charger", Duration::from_secs(30)).await;
    let faulty = Arc::new(Faulty::new(Arc::new(MemoryStore::new())));
    faulty.inject_always(Operation::Claim, Fault::Fail);
    let retry_delay = Duration::from_millis(50);
    let door = JetStreamDoor::new(Idempotency::builder_shared(faulty.clone()).build())
        .retry_delay(retry_delay);
    let runs = Arc::new(AtomicUsize::new(0));
    let charge = |runs: Arc<AtomicUsize>| {
        move |_key, _message| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(5u32)
        }
    };
    let message = fetch(&consumer, 1).await.remove(0);
    match door
        .handle(message, charge(runs.clone()))
        .await
        .expect("answered")
    {
        Handled::Protected {
            outcome: Outcome::StoreUnavailable(_),
            reply: Reply::Nak(delay),
            ..
        } => assert_eq!(delay, retry_delay),
        other => panic!("expected a nak for the outage, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "ran without a claim");
    faulty.heal();
    let again = fetch(&consumer, 1).await.remove(0);
    let handled = door
        .handle(again, charge(runs.clone()))
        .await
        .expect("answered");
    assert!(
        matches!(
            handled,
            Handled::Protected {
                outcome: Outcome::Ran(5),
                reply: Reply::Ack,
                ..
            }
        ),
        "{handled:?}"
    );
    test.settled(&consumer, 1).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    test.delete().await;
}

/// A consumer that crashes mid-message (after its first step, before its record): the
/// server delivers the message again after `ack_wait` to another consumer process, which
/// takes the key over once the crashed claim's lease ran out (on the store's clock),
/// resumes after the recorded step, and acknowledges it.
async fn check_a_crashed_consumers_message_is_taken_over_and_resumed() {
    let test = TestStream::new("crash").await;
    test.publish(Some("order-3"), "charge 3").await;
    let consumer = test.consumer("charger", Duration::from_millis(500)).await;
    let clock = ManualClock::new();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
    let lease = Duration::from_secs(30);
    let process = || {
        JetStreamDoor::new(
            Idempotency::builder_shared(store.clone())
                .default_lease(lease)
                .build(),
        )
    };
    let (authorised, captured) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (hung_tx, mut hung) = tokio::sync::mpsc::channel::<()>(1);
    // Authorises (a step), then — in the process that crashes — hangs, else captures.
    let pay = {
        let (authorised, captured) = (authorised.clone(), captured.clone());
        move |crash: bool| {
            let (authorised, captured, hung_tx) =
                (authorised.clone(), captured.clone(), hung_tx.clone());
            move |key: IdempotencyKey, _message: async_nats::Message| {
                let (authorised, captured, hung_tx) =
                    (authorised.clone(), captured.clone(), hung_tx.clone());
                async move {
                    let authorisation = key
                        .step("authorise", || async {
                            Ok::<_, String>(authorised.fetch_add(1, Ordering::SeqCst) + 1)
                        })
                        .await
                        .map_err(|error| error.to_string())?;
                    if crash {
                        let _ = hung_tx.send(()).await;
                        std::future::pending::<()>().await;
                    }
                    captured.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(authorisation)
                }
            }
        }
    };
    let crashing = tokio::spawn({
        let (door, consumer, pay) = (process(), consumer.clone(), pay.clone());
        async move {
            let _ = door.run(&consumer, pay(true)).await;
        }
    });
    hung.recv().await.expect("the first process authorised");
    // The process dies: it answers nothing, and renews nothing from here on.
    crashing.abort();
    clock.advance(lease * 2);
    let survivor = tokio::spawn({
        let (door, consumer, pay) = (process(), consumer.clone(), pay.clone());
        async move {
            let _ = door.run(&consumer, pay(false)).await;
        }
    });
    test.settled(&consumer, 1).await;
    survivor.abort();
    assert_eq!(
        authorised.load(Ordering::SeqCst),
        1,
        "the recorded step ran again"
    );
    assert_eq!(captured.load(Ordering::SeqCst), 1);
    test.delete().await;
}

/// The inbox over JetStream: 32 deliveries of one id through four runners write one
/// ledger row, in the same SQLite transaction as the record, and are all acknowledged; a
/// message whose function fails after writing has its row rolled back, is delivered
/// again, and writes it once. Effects are counted in the table.
#[cfg(feature = "sqlite")]
async fn check_the_inbox_writes_each_message_once() {
    use idempotent_runtime::store::SqliteStore;
    use idempotent_runtime::transaction::Tx;
    use sqlx::Sqlite;

    let test = TestStream::new("inbox").await;
    for _ in 0..32 {
        test.publish_with(Some((ORDER_ID, "order-1")), "100").await;
    }
    test.publish_with(Some((ORDER_ID, "order-2")), "200").await;
    let consumer = test.consumer("ledger", Duration::from_secs(30)).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("inbox.db");
    let store = SqliteStore::connect(path.to_str().expect("utf-8"))
        .await
        .expect("open the SQLite store");
    let pool = store.pool().clone();
    sqlx::query("CREATE TABLE ledger (message TEXT NOT NULL, cents INTEGER NOT NULL)")
        .execute(&pool)
        .await
        .expect("create the ledger");
    let idempotency = Idempotency::new(store);
    // order-2's first run fails after its write.
    let failed_once = Arc::new(AtomicUsize::new(0));
    const WAITING: HandlerConfig = HandlerConfig::new()
        .name("ledger")
        .wait(Duration::from_secs(20));
    let runners: Vec<_> = (0..4)
        .map(|_| {
            let door = JetStreamDoor::new(idempotency.clone())
                .key_header(ORDER_ID)
                .config(WAITING)
                .retry_delay(Duration::from_millis(50))
                .concurrency(8);
            let (consumer, failed_once) = (consumer.clone(), failed_once.clone());
            tokio::spawn(async move {
                let _ = door
                    .run_in_transaction(
                        &consumer,
                        async move |key, message, tx: &mut Tx<Sqlite>| {
                            let cents: i64 = String::from_utf8_lossy(&message.payload)
                                .parse()
                                .expect("cents");
                            sqlx::query("INSERT INTO ledger VALUES (?, ?)")
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
                    .await;
            })
        })
        .collect();
    test.settled(&consumer, 33).await;
    for runner in runners {
        runner.abort();
    }
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT message, cents FROM ledger ORDER BY message")
            .fetch_all(&pool)
            .await
            .expect("the ledger");
    assert_eq!(
        rows,
        vec![("order-1".to_owned(), 100), ("order-2".to_owned(), 200)],
        "one row per message"
    );
    assert!(
        failed_once.load(Ordering::SeqCst) >= 2,
        "order-2 ran again after its failure"
    );
    test.delete().await;
}

pub(crate) fn trials() -> Vec<Trial> {
    type Check = fn() -> std::pin::Pin<Box<dyn Future<Output = ()>>>;
    let checks: [(&str, Check); 10] = [
        (
            "a_key_read_from_the_payload_dedupes_and_one_without_it_is_terminated",
            || {
                Box::pin(
                    check_a_key_read_from_the_payload_dedupes_and_one_without_it_is_terminated(),
                )
            },
        ),
        (
            "a_dead_letter_that_comes_back_is_not_published_again",
            || Box::pin(check_a_dead_letter_that_comes_back_is_not_published_again()),
        ),
        (
            "a_crashed_consumers_message_is_taken_over_and_resumed",
            || Box::pin(check_a_crashed_consumers_message_is_taken_over_and_resumed()),
        ),
        ("a_store_outage_naks_and_runs_nothing", || {
            Box::pin(check_a_store_outage_naks_and_runs_nothing())
        }),
        ("published_twice_runs_once_and_both_are_acked", || {
            Box::pin(check_published_twice_runs_once_and_both_are_acked())
        }),
        ("without_the_door_the_effect_happens_twice", || {
            Box::pin(check_without_the_door_the_effect_happens_twice())
        }),
        ("thirty_two_deliveries_of_one_id_run_once", || {
            Box::pin(check_thirty_two_deliveries_of_one_id_run_once())
        }),
        ("a_failed_message_is_redelivered_then_runs", || {
            Box::pin(check_a_failed_message_is_redelivered_then_runs())
        }),
        ("a_message_without_an_id_is_handled_as_configured", || {
            Box::pin(check_a_message_without_an_id_is_handled_as_configured())
        }),
        (
            "a_duplicate_of_a_running_message_is_nakd_with_the_lease_left",
            || Box::pin(check_a_duplicate_of_a_running_message_is_nakd_with_the_lease_left()),
        ),
    ];
    #[allow(unused_mut)] // the SQLite check is added only with its feature
    let mut trials: Vec<Trial> = checks
        .into_iter()
        .map(|(name, check)| async_trial(format!("nats::{name}"), check))
        .collect();
    #[cfg(feature = "sqlite")]
    trials.push(async_trial(
        "nats::the_inbox_writes_each_message_once",
        check_the_inbox_writes_each_message_once,
    ));
    ignored_if(unavailable(), trials)
}
