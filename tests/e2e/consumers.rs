//! The payments demo's charge consumer as real processes on the real brokers (NATS
//! JetStream, RabbitMQ): a `kill -9` mid-message, a redelivery of a command already
//! handled, and 32 deliveries of one command at once through two processes. Each command
//! must leave one ledger row and one gateway charge; the gateway call itself is at least
//! once (a crash between the call and the record makes the redelivery call again, with the
//! same derived key, which the gateway deduplicates). Every test runs again with the
//! demo's `--dedupe off` and shows the duplicates the protection prevents.
//!
//! Built with the demo's `nats` or `rabbitmq` feature; needs `IDEMPOTENT_TEST_NATS_URL` /
//! `IDEMPOTENT_TEST_RABBITMQ_URL` (a broker whose feature is off or whose variable is
//! unset has its tests reported ignored). The store is an SQLite file, and Postgres and
//! MySQL with `IDEMPOTENT_TEST_POSTGRES_URL` and `IDEMPOTENT_TEST_MYSQL_URL`.
#![allow(dead_code)] // a build without a broker's feature leaves some of it unused

use std::future::Future;
use std::pin::Pin;
use std::process::Command;
use std::time::Duration;

use idempotent_demo::consumer::ChargeCommand;
use idempotent_demo::database::{self, Database};
use idempotent_demo::payments::PAUSE_LINE;
use idempotent_runtime::testing::{Trial, async_trial, ignored_if};

use crate::support::process::{Instance, Output, Server, TestBackend};

const DEMO: &str = env!("CARGO_BIN_EXE_payments-demo");
/// Short, so a test waits little for a dead consumer's lease; long enough that the
/// restarted consumer, started under a loaded machine, still finds it held.
const LEASE: &str = "6s";
/// How long a test waits for a condition before it fails (a working consumer meets it in
/// seconds; the bound only keeps a broken one from hanging the run).
const SETTLE_WITHIN: Duration = Duration::from_secs(60);

/// A broker the consumer reads charge commands from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Broker {
    Nats,
    RabbitMq,
}

impl Broker {
    fn env_var(self) -> &'static str {
        match self {
            Broker::Nats => "IDEMPOTENT_TEST_NATS_URL",
            Broker::RabbitMq => "IDEMPOTENT_TEST_RABBITMQ_URL",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Broker::Nats => "nats",
            Broker::RabbitMq => "rabbitmq",
        }
    }

    /// Why tests on this broker cannot run here, if they cannot.
    fn unavailable(self) -> Option<String> {
        let built = match self {
            Broker::Nats => cfg!(feature = "nats"),
            Broker::RabbitMq => cfg!(feature = "rabbitmq"),
        };
        if !built {
            return Some(format!("built without the `{}` feature", self.name()));
        }
        match std::env::var(self.env_var()) {
            Ok(url) if !url.is_empty() => None,
            _ => Some(format!("{} is not set", self.env_var())),
        }
    }

    fn url(self) -> String {
        std::env::var(self.env_var()).unwrap_or_else(|_| panic!("{} is not set", self.env_var()))
    }
}

/// One test's case: the broker, the store (`None`: an SQLite file) and the demo's dedupe.
#[derive(Debug, Clone, Copy)]
struct Case {
    broker: Broker,
    store: Option<Server>,
    dedupe: bool,
}

type Test = fn(Case) -> Pin<Box<dyn Future<Output = ()>>>;

pub(crate) fn trials() -> Vec<Trial> {
    let tests: [(&str, Test); 3] = [
        ("kill_9_mid_message", |case| {
            Box::pin(kill_9_mid_message(case))
        }),
        ("a_handled_command_delivered_again", |case| {
            Box::pin(a_handled_command_delivered_again(case))
        }),
        ("thirty_two_deliveries_at_once_on_two_processes", |case| {
            Box::pin(thirty_two_deliveries_at_once_on_two_processes(case))
        }),
    ];
    let mut trials = Vec::new();
    for broker in [Broker::Nats, Broker::RabbitMq] {
        // Off only on SQLite: showing the duplicates once is enough.
        for (store, dedupe) in [
            (None, true),
            (Some(Server::Postgres), true),
            (Some(Server::MySql), true),
            (None, false),
        ] {
            let case = Case {
                broker,
                store,
                dedupe,
            };
            let store_name = store.map_or("sqlite", Server::name);
            let dedupe_name = if dedupe { "dedupe_on" } else { "dedupe_off" };
            let on_case = tests
                .iter()
                .map(|&(name, test)| {
                    async_trial(
                        format!("{}::{store_name}::{dedupe_name}::{name}", broker.name()),
                        move || test(case),
                    )
                })
                .collect();
            let unavailable = broker
                .unavailable()
                .or_else(|| store.and_then(Server::unavailable));
            trials.extend(ignored_if(unavailable, on_case));
        }
    }
    trials
}

/// Where one test's demo processes keep their state (an SQLite file, or a database on a
/// server), and the stream or queue they consume.
struct Place {
    case: Case,
    dir: tempfile::TempDir,
    url: String,
    flags: Vec<String>,
    backend: Option<TestBackend>,
    channel: Channel,
}

impl Place {
    async fn create(case: Case, test: &str) -> Place {
        let dir = tempfile::tempdir().expect("temp dir");
        let (url, flags, backend) = match case.store {
            // The consumer's gateway keeps its charges in a file of its own on SQLite.
            None => (
                format!("sqlite://{}", dir.path().join("payments.db").display()),
                vec![
                    "--gateway-database-url".to_owned(),
                    format!("sqlite://{}", dir.path().join("gateway.db").display()),
                ],
                None,
            ),
            Some(server) => {
                let backend = TestBackend::create(server, "consumer").await;
                (backend.url.clone(), backend.flags.clone(), Some(backend))
            }
        };
        let channel = Channel::create(case.broker, test).await;
        Place {
            case,
            dir,
            url,
            flags,
            backend,
            channel,
        }
    }

    /// A consumer process (stderr collected), pausing at `pause` if given, its gateway
    /// answering after `latency_ms`.
    async fn consumer(&self, pause: Option<&str>, latency_ms: u64) -> (Instance, Output) {
        let mut command = Command::new(DEMO);
        command.env(
            "RUST_LOG",
            "warn,idempotent_demo::consumer=info,idempotent_runtime::doors=info",
        );
        command.env_remove("PAYMENTS_DEMO_PAUSE_AFTER_STEP");
        if let Some(step) = pause {
            command.env("PAYMENTS_DEMO_PAUSE_AFTER_STEP", step);
        }
        let latency = latency_ms.to_string();
        let mut flags: Vec<String> = self.flags.clone();
        flags.extend(self.channel.flags());
        let dedupe = if self.case.dedupe { "on" } else { "off" };
        flags.extend(
            [
                "--lease",
                LEASE,
                "--gateway-latency-ms",
                latency.as_str(),
                "--consumer-concurrency",
                "16",
                "--dedupe",
                dedupe,
            ]
            .map(str::to_owned),
        );
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Instance::start_captured(command, &self.url, &flags).await
    }

    /// The database holding the consumer's rows (the store's own).
    async fn tables(&self) -> Database {
        match &self.backend {
            Some(backend) => backend.tables().await,
            None => database::open_tables(&self.url)
                .await
                .expect("open the SQLite file"),
        }
    }

    /// The database holding the consumer's gateway's charges and calls.
    async fn gateway_tables(&self) -> Database {
        match &self.backend {
            Some(backend) => backend.tables().await,
            None => database::open_tables(&self.flags[1])
                .await
                .expect("open the gateway's SQLite file"),
        }
    }

    /// How many rows `statement` (a `COUNT(*)` with `$1` bound to `value`) counts in `db`.
    async fn count(db: Database, statement: &str, value: &str) -> i64 {
        let sql = db.dialect(statement);
        idempotent_demo::on_pool!(&db, |pool| sqlx::query_scalar::<_, i64>(
            sqlx::AssertSqlSafe(sql.as_str())
        )
        .bind(value.to_owned())
        .fetch_one(pool)
        .await
        .expect("count rows"))
    }

    /// The ledger rows the consumer wrote for command `id`.
    async fn rows(&self, id: &str) -> i64 {
        Self::count(
            self.tables().await,
            "SELECT COUNT(*) FROM demo_consumed_charges WHERE command_id = $1",
            id,
        )
        .await
    }

    /// The charges the gateway made to `account`.
    async fn charges(&self, account: &str) -> i64 {
        Self::count(
            self.gateway_tables().await,
            "SELECT COUNT(*) FROM demo_charges WHERE account = $1",
            account,
        )
        .await
    }

    /// The calls that reached the gateway (every call carries a key; each test charges one
    /// account).
    async fn calls(&self) -> i64 {
        Self::count(
            self.gateway_tables().await,
            "SELECT COUNT(*) FROM demo_gateway_calls WHERE downstream_key <> $1",
            "",
        )
        .await
    }

    async fn delete(self) {
        self.channel.delete().await;
    }
}

/// A command of its own for one test, for an account of its own.
fn command(test: &str) -> (ChargeCommand, String) {
    let id = format!("cmd_{test}_{:08x}", rand::random::<u32>());
    let command = ChargeCommand {
        id: id.clone(),
        account: format!("acct_{id}"),
        amount: 10_000,
        currency: "BRL".to_owned(),
    };
    let body = serde_json::to_string(&command).expect("a command serialises");
    (command, body)
}

/// The deliveries of command `id` the processes writing `outputs` acknowledged, and of
/// those how many replayed: the doors log each delivery under its key (`key=…`), the
/// plain loop of `--dedupe off` under its command (`command=…`).
fn acknowledged(outputs: &[&Output], id: &str) -> (usize, usize) {
    let (key, command) = (format!("key={id} "), format!("command={id} "));
    let lines: Vec<String> = outputs
        .iter()
        .flat_map(|output| output.lines())
        .filter(|line| {
            line.contains("acknowledged") && (line.contains(&key) || line.contains(&command))
        })
        .collect();
    let replayed = lines
        .iter()
        .filter(|line| line.contains("outcome=replayed"))
        .count();
    (lines.len(), replayed)
}

/// Polls `condition` every 25 ms until it holds; fails the test, naming `what` and
/// showing what the consumers wrote (`outputs`), after [`SETTLE_WITHIN`].
async fn settle(what: &str, outputs: &[&Output], mut condition: impl FnMut() -> bool) {
    let started = tokio::time::Instant::now();
    while !condition() {
        if started.elapsed() > SETTLE_WITHIN {
            let logs: Vec<String> = outputs.iter().flat_map(|output| output.lines()).collect();
            panic!(
                "timed out waiting until {what}; the consumers wrote:\n{}",
                logs.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A consumer killed (`SIGKILL`) after the gateway charged and the row was written,
/// before the row and the record commit; another one started on the same database and
/// broker. The broker delivers the command again (RabbitMQ at once, as the connection
/// drops; JetStream after `ack_wait`); the new process finds the dead one's claim until
/// its lease runs out, then takes the command over: the gateway is called again with the
/// same derived key and answers with its first charge, and the row is written once.
async fn kill_9_mid_message(case: Case) {
    let place = Place::create(case, "kill").await;
    let (command, body) = command("kill");
    let (mut crashed, crashed_output) = place.consumer(Some("consumed-charge"), 0).await;
    place.channel.publish(&body).await;
    let paused = format!("{PAUSE_LINE} consumed-charge");
    settle(
        "the consumer pauses after the gateway call and the row",
        &[&crashed_output],
        || crashed_output.has_line_with(&[&paused]),
    )
    .await;
    crashed.kill();

    let (_restarted, output) = place.consumer(None, 0).await;
    settle(
        "the restarted consumer acknowledges the command",
        &[&output],
        || acknowledged(&[&output], &command.id).0 >= 1,
    )
    .await;
    let (rows, charges, calls) = (
        place.rows(&command.id).await,
        place.charges(&command.account).await,
        place.calls().await,
    );
    if case.dedupe {
        assert_eq!(rows, 1, "one ledger row for the command");
        assert_eq!(charges, 1, "the gateway charged once: the same derived key");
        // At least once: the call the crash cut off from its record is made again.
        assert_eq!(calls, 2, "the gateway was called again after the crash");
        assert!(
            output.has_line_with(&[&format!("key={} ", command.id), "outcome=in_progress"]),
            "the redelivery waited for the dead consumer's lease"
        );
    } else {
        assert!(
            rows >= 2,
            "without dedupe the redelivery writes again: {rows}"
        );
        assert!(charges >= 2, "and charges again: {charges}");
    }
    place.delete().await;
}

/// A command handled and acknowledged, then delivered again (a publisher's retry, a lost
/// acknowledgement): the second delivery replays the recorded outcome.
async fn a_handled_command_delivered_again(case: Case) {
    let place = Place::create(case, "again").await;
    let (command, body) = command("again");
    let (_consumer, output) = place.consumer(None, 0).await;
    place.channel.publish(&body).await;
    settle("the first delivery is acknowledged", &[&output], || {
        acknowledged(&[&output], &command.id).0 == 1
    })
    .await;
    place.channel.publish(&body).await;
    settle("the second delivery is acknowledged", &[&output], || {
        acknowledged(&[&output], &command.id).0 == 2
    })
    .await;
    let (rows, charges, calls) = (
        place.rows(&command.id).await,
        place.charges(&command.account).await,
        place.calls().await,
    );
    if case.dedupe {
        assert_eq!(acknowledged(&[&output], &command.id).1, 1, "replayed");
        assert_eq!((rows, charges, calls), (1, 1, 1), "rows, charges, calls");
    } else {
        assert_eq!((rows, charges), (2, 2), "without dedupe: rows, charges");
    }
    place.delete().await;
}

/// One command delivered 32 times at once to two consumer processes (16 at a time each),
/// while its first run is still at the gateway: one run, 31 replays.
async fn thirty_two_deliveries_at_once_on_two_processes(case: Case) {
    let place = Place::create(case, "many").await;
    let (command, body) = command("many");
    // The gateway answers slowly, so the duplicates arrive while the first run is there.
    let (_first, first_output) = place.consumer(None, 200).await;
    let (_second, second_output) = place.consumer(None, 200).await;
    for _ in 0..32 {
        place.channel.publish(&body).await;
    }
    settle(
        "all 32 deliveries are acknowledged",
        &[&first_output, &second_output],
        || acknowledged(&[&first_output, &second_output], &command.id).0 == 32,
    )
    .await;
    let (rows, charges, calls) = (
        place.rows(&command.id).await,
        place.charges(&command.account).await,
        place.calls().await,
    );
    if case.dedupe {
        let replayed = acknowledged(&[&first_output, &second_output], &command.id).1;
        assert_eq!(replayed, 31, "one run, 31 replays");
        assert_eq!((rows, charges, calls), (1, 1, 1), "rows, charges, calls");
    } else {
        assert_eq!((rows, charges), (32, 32), "without dedupe: rows, charges");
    }
    place.delete().await;
}

/// A stream (NATS) or a queue (RabbitMQ) of one test's own, and a publisher to it.
enum Channel {
    #[cfg(feature = "nats")]
    Nats {
        url: String,
        jetstream: async_nats::jetstream::Context,
        stream: String,
    },
    #[cfg(feature = "rabbitmq")]
    RabbitMq {
        url: String,
        connection: lapin::Connection,
        publisher: lapin::Channel,
        queue: String,
    },
}

impl Channel {
    /// A fresh stream or queue on `broker`, created before any consumer starts so that
    /// nothing published is lost.
    async fn create(broker: Broker, test: &str) -> Channel {
        let name = format!("idem_consumer_{test}_{:08x}", rand::random::<u32>());
        match broker {
            #[cfg(feature = "nats")]
            Broker::Nats => {
                let url = broker.url();
                let client = async_nats::connect(&url).await.expect("connect to NATS");
                let jetstream = async_nats::jetstream::new(client);
                let stream = name.to_uppercase();
                jetstream
                    .create_stream(async_nats::jetstream::stream::Config {
                        name: stream.clone(),
                        subjects: vec![idempotent_demo::consumer::nats::subject(&stream)],
                        ..Default::default()
                    })
                    .await
                    .expect("create the stream");
                Channel::Nats {
                    url,
                    jetstream,
                    stream,
                }
            }
            #[cfg(feature = "rabbitmq")]
            Broker::RabbitMq => {
                use lapin::options::{ConfirmSelectOptions, QueueDeclareOptions};
                let url = broker.url();
                let connection =
                    lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
                        .await
                        .expect("connect to RabbitMQ");
                let publisher = connection.create_channel().await.expect("a channel");
                publisher
                    .confirm_select(ConfirmSelectOptions::default())
                    .await
                    .expect("publisher confirms");
                publisher
                    .queue_declare(
                        name.as_str().into(),
                        QueueDeclareOptions::default(),
                        lapin::types::FieldTable::default(),
                    )
                    .await
                    .expect("declare the queue");
                Channel::RabbitMq {
                    url,
                    connection,
                    publisher,
                    queue: name,
                }
            }
            #[allow(unreachable_patterns)]
            _ => panic!("{name}: built without the `{}` feature", broker.name()),
        }
    }

    /// The demo's flags that consume it.
    fn flags(&self) -> Vec<String> {
        let flags: Vec<&str> = match self {
            #[cfg(feature = "nats")]
            Channel::Nats { url, stream, .. } => vec![
                "--consume-nats",
                url,
                "--nats-stream",
                stream,
                // Short: a crashed consumer's message comes back soon.
                "--nats-ack-wait",
                "1s",
            ],
            #[cfg(feature = "rabbitmq")]
            Channel::RabbitMq { url, queue, .. } => {
                vec!["--consume-rabbitmq", url, "--rabbitmq-queue", queue]
            }
        };
        flags.into_iter().map(str::to_owned).collect()
    }

    /// Publishes `body`, confirmed by the broker as stored. On JetStream without a
    /// `Nats-Msg-Id`: the server's own duplicate window would drop a republish, and the
    /// test is of the consumer's deduplication.
    async fn publish(&self, body: &str) {
        match self {
            #[cfg(feature = "nats")]
            Channel::Nats {
                jetstream, stream, ..
            } => {
                let ack = jetstream
                    .publish(
                        idempotent_demo::consumer::nats::subject(stream),
                        body.to_owned().into(),
                    )
                    .await
                    .expect("publish")
                    .await
                    .expect("the server's publish ack");
                assert!(!ack.duplicate, "the server stored the message");
            }
            #[cfg(feature = "rabbitmq")]
            Channel::RabbitMq {
                publisher, queue, ..
            } => {
                publisher
                    .basic_publish(
                        "".into(),
                        queue.as_str().into(),
                        lapin::options::BasicPublishOptions::default(),
                        body.as_bytes(),
                        lapin::protocol::BasicProperties::default(),
                    )
                    .await
                    .expect("publish")
                    .await
                    .expect("the broker's confirm");
            }
        }
    }

    async fn delete(self) {
        match self {
            #[cfg(feature = "nats")]
            Channel::Nats {
                jetstream, stream, ..
            } => {
                let _ = jetstream.delete_stream(&stream).await;
            }
            #[cfg(feature = "rabbitmq")]
            Channel::RabbitMq {
                connection,
                publisher,
                queue,
                ..
            } => {
                let _ = publisher
                    .queue_delete(
                        queue.as_str().into(),
                        lapin::options::QueueDeleteOptions::default(),
                    )
                    .await;
                let _ = connection.close(200, "done".into()).await;
            }
        }
    }
}
