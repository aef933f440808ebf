//! Command-line flags shared by the demo binaries, each with an environment fallback.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};
use idempotent_runtime::duration;

use crate::consumer::Dedupe;
use crate::gateway::KeyHandling;
use crate::payments::Authorise;

/// Flags of the demo APIs.
#[derive(Debug, Clone, Parser)]
#[command(about = "An idempotent demo API", version)]
pub struct DemoArgs {
    /// Address to listen on.
    #[arg(long, env = "ADDR", default_value = "127.0.0.1:3000")]
    pub addr: SocketAddr,

    /// Where the idempotency records live, by URL scheme: `sqlite://file.db` (created if
    /// missing), `postgres://user@host/db`, `mysql://user@host/db` (MySQL 8 or MariaDB
    /// 10.6+) or `redis://host:6379/` (`?key_prefix=…` sets the key prefix).
    #[arg(long, env = "DATABASE_URL", default_value = "sqlite://payments.db")]
    pub database_url: String,

    /// With a `redis://` store: the SQL database the payments demo's gateway keeps its
    /// charges in (Redis holds only idempotency records). With an `sqlite://` store: where
    /// the charge consumer's gateway keeps its charges (the consumer's inbox holds the
    /// store file's write lock while it calls the gateway). Every process of the demo
    /// should name the same one.
    #[arg(
        long,
        env = "GATEWAY_DATABASE_URL",
        default_value = "sqlite://payments-gateway.db"
    )]
    pub gateway_database_url: String,

    /// How long to wait at startup for a Postgres or MySQL database that refuses
    /// connections (e.g. restarting), retrying and logging each attempt, before giving
    /// up; `0s` gives up at the first refusal.
    #[arg(long, env = "DATABASE_WAIT", default_value = "60s", value_parser = duration::parse_or_zero)]
    pub database_wait: Duration,

    /// Where `database_url` came from: a flag, `DATABASE_URL` or the default. Worth
    /// logging, because sqlx users often have `DATABASE_URL` exported for another project.
    #[arg(skip = DatabaseUrlFrom::Default)]
    pub database_url_from: DatabaseUrlFrom,

    /// Latency of the fake payment gateway, in milliseconds.
    #[arg(long, env = "GATEWAY_LATENCY_MS", default_value_t = 50)]
    pub gateway_latency_ms: u64,

    /// The engine's default lease (e.g. `30s`): how long a claim stays owned without a
    /// heartbeat, so how soon a crashed instance's request can be retried.
    #[arg(long, env = "IDEMPOTENCY_LEASE", default_value = "30s", value_parser = duration::parse)]
    pub lease: Duration,

    /// The engine's default TTL (e.g. `24h`): how long a key is remembered. Shorten it to
    /// watch an expired key run as new.
    #[arg(long, env = "IDEMPOTENCY_TTL", default_value = "24h", value_parser = duration::parse)]
    pub ttl: Duration,

    /// The engine's default wait (e.g. `5s`): a duplicate that finds the original still
    /// running waits up to this long for its outcome (and gets the replay) instead of
    /// `409` at once. Off by default.
    #[arg(long, env = "IDEMPOTENCY_WAIT", value_parser = duration::parse)]
    pub wait: Option<Duration>,

    /// Payments demo: append one line per external effect of the fake providers
    /// (`authorised …` or `declined …` per gateway call, `receipt_sent …` per receipt
    /// mailed) to this file, so they can be counted across crashes. Off by default.
    #[arg(long, env = "PAYMENTS_DEMO_EFFECTS_LOG")]
    pub effects_log: Option<PathBuf>,

    /// Payments demo: the Standard Webhooks secret (`whsec_…`) the gateway signs the events
    /// it posts to `POST /webhooks/gateway` with. The default is a published demo secret:
    /// set your own outside a demo.
    #[arg(
        long,
        env = "PAYMENTS_DEMO_WEBHOOK_SECRET",
        default_value = crate::payments::DEMO_WEBHOOK_SECRET
    )]
    pub webhook_secret: String,

    /// Test hook of the payments demo, off by default: after `POST /payments` has recorded
    /// the named step (`authorise`, `ledger` or `receipt`) — or, for `authorise-call`,
    /// after the gateway answered and before that answer is recorded; for
    /// `consumed-charge`, after a consumed charge command's gateway call and row, before
    /// they commit with its record — print `paused after step NAME` to stderr and wait
    /// forever, so a test can `kill -9` the process at a known point.
    #[arg(
        long,
        env = "PAYMENTS_DEMO_PAUSE_AFTER_STEP",
        value_name = "STEP",
        value_parser = ["authorise-call", "authorise", "ledger", "receipt", "consumed-charge"]
    )]
    pub pause_after_step: Option<String>,

    /// Payments demo: whether the fake gateway deduplicates charges by their idempotency
    /// key (`honour`, like most providers) or charges on every call (`ignore`, like a
    /// provider without keys, where only the demo's at-most-once `authorise` step keeps a
    /// payment from being charged twice).
    #[arg(long, env = "GATEWAY_KEYS", value_enum, default_value_t = KeyHandling::Honour)]
    pub gateway_keys: KeyHandling,

    /// Payments demo: how `POST /payments` guards its gateway call — `at-most-once`
    /// (looks a call with a lost answer up before calling again) or `at-least-once` (calls
    /// again; for comparison with `--gateway-keys ignore`).
    #[arg(long, env = "PAYMENTS_DEMO_AUTHORISE", value_enum, default_value_t = Authorise::AtMostOnce)]
    pub authorise: Authorise,

    /// Payments demo (feature `nats`): consume charge commands from the JetStream of the
    /// NATS server at this URL (e.g. `nats://127.0.0.1:4222`), from the stream
    /// `--nats-stream`. Off by default.
    #[arg(long, env = "PAYMENTS_DEMO_CONSUME_NATS", value_name = "URL")]
    pub consume_nats: Option<String>,

    /// The JetStream stream the charge commands are in (created if missing); publish them
    /// to the subject `STREAM.commands`.
    #[arg(long, env = "PAYMENTS_DEMO_NATS_STREAM", default_value = "CHARGES")]
    pub nats_stream: String,

    /// How long JetStream waits for a charge command's acknowledgement before delivering
    /// it again (to another process, after a crash). Set when the stream's consumer is
    /// created.
    #[arg(long, env = "PAYMENTS_DEMO_NATS_ACK_WAIT", default_value = "30s", value_parser = duration::parse)]
    pub nats_ack_wait: Duration,

    /// Payments demo (feature `rabbitmq`): consume charge commands from the RabbitMQ
    /// broker at this URL (e.g. `amqp://guest:guest@127.0.0.1:5672/%2f`), from the queue
    /// `--rabbitmq-queue`. Off by default.
    #[arg(long, env = "PAYMENTS_DEMO_CONSUME_RABBITMQ", value_name = "URL")]
    pub consume_rabbitmq: Option<String>,

    /// The RabbitMQ queue the charge commands are in (declared if missing).
    #[arg(long, env = "PAYMENTS_DEMO_RABBITMQ_QUEUE", default_value = "charges")]
    pub rabbitmq_queue: String,

    /// How many charge commands each consumer handles at once.
    #[arg(long, env = "PAYMENTS_DEMO_CONSUMER_CONCURRENCY", default_value_t = 16)]
    pub consumer_concurrency: usize,

    /// Whether the charge consumer runs each command once per id (`on`) or every delivery
    /// as it comes, with a gateway key of its own (`off`: what the protection prevents,
    /// for comparison).
    #[arg(long, env = "PAYMENTS_DEMO_DEDUPE", value_enum, default_value_t = Dedupe::On)]
    pub dedupe: Dedupe,
}

/// Where the database URL came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseUrlFrom {
    /// `--database-url`.
    Flag,
    /// The `DATABASE_URL` environment variable.
    Environment,
    /// Neither: the built-in default.
    Default,
}

impl std::fmt::Display for DatabaseUrlFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DatabaseUrlFrom::Flag => "--database-url",
            DatabaseUrlFrom::Environment => "DATABASE_URL",
            DatabaseUrlFrom::Default => "default",
        })
    }
}

impl DemoArgs {
    /// Parses the process's flags and environment; prints the error and exits on a bad
    /// flag, `--help` or a lease that is not shorter than the TTL.
    pub fn from_env() -> Self {
        Self::try_from_iter(std::env::args_os()).unwrap_or_else(|err| err.exit())
    }

    /// Parses `args` (the first is the program name) and the environment.
    pub fn try_from_iter<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut command = Self::command();
        let matches = command.try_get_matches_from_mut(args)?;
        let mut parsed = Self::from_arg_matches(&matches)?;
        parsed.database_url_from = match matches.value_source("database_url") {
            Some(ValueSource::CommandLine) => DatabaseUrlFrom::Flag,
            Some(ValueSource::EnvVariable) => DatabaseUrlFrom::Environment,
            _ => DatabaseUrlFrom::Default,
        };
        if parsed.lease >= parsed.ttl {
            return Err(command.error(
                clap::error::ErrorKind::ArgumentConflict,
                format!(
                    "--lease ({}) must be shorter than --ttl ({})",
                    duration::format(parsed.lease),
                    duration::format(parsed.ttl)
                ),
            ));
        }
        Ok(parsed)
    }

    /// The fake gateway's latency.
    pub fn gateway_latency(&self) -> Duration {
        Duration::from_millis(self.gateway_latency_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags read the attribute's grammar (`idempotent_runtime::duration`).
    #[test]
    fn durations_are_the_attributes_grammar() {
        let args =
            DemoArgs::try_from_iter(["demo", "--ttl", "1h 30m", "--lease", "1s500ms"]).unwrap();
        assert_eq!(args.ttl, Duration::from_secs(5400));
        assert_eq!(args.lease, Duration::from_millis(1500));
        // The startup wait's zero means "at once": the same grammar, zero allowed.
        let args = DemoArgs::try_from_iter(["demo", "--database-wait", "0s"]).unwrap();
        assert_eq!(args.database_wait, Duration::ZERO);
        for (bad, says) in [
            ("soon", "\"soon\" is not a whole number followed by a unit"),
            ("0s", "is zero"),
            ("1.5h", "write whole numbers"),
        ] {
            let error = DemoArgs::try_from_iter(["demo", "--ttl", bad]).unwrap_err();
            assert_eq!(error.kind(), clap::error::ErrorKind::ValueValidation);
            assert!(error.to_string().contains(says), "{error}");
        }
    }

    #[test]
    fn waiting_is_off_unless_asked_for() {
        assert_eq!(DemoArgs::try_from_iter(["demo"]).unwrap().wait, None);
        let args = DemoArgs::try_from_iter(["demo", "--wait", "5s"]).unwrap();
        assert_eq!(args.wait, Some(Duration::from_secs(5)));
    }

    #[test]
    fn the_lease_must_be_shorter_than_the_ttl() {
        let err = DemoArgs::try_from_iter(["demo", "--ttl", "20s", "--lease", "20s"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
        assert!(
            err.to_string()
                .contains("--lease (20s) must be shorter than --ttl (20s)")
        );
    }

    #[test]
    fn the_payments_test_hooks_are_off_unless_asked_for() {
        let args = DemoArgs::try_from_iter(["demo"]).unwrap();
        assert_eq!((args.effects_log, args.pause_after_step), (None, None));
        let args = DemoArgs::try_from_iter(["demo", "--pause-after-step", "ledger"]).unwrap();
        assert_eq!(args.pause_after_step.as_deref(), Some("ledger"));
        let bad = DemoArgs::try_from_iter(["demo", "--pause-after-step", "charge"]).unwrap_err();
        assert_eq!(bad.kind(), clap::error::ErrorKind::InvalidValue);
    }

    #[test]
    fn the_consumer_is_off_and_deduplicates_unless_told_otherwise() {
        let args = DemoArgs::try_from_iter(["demo"]).unwrap();
        assert_eq!((args.consume_nats, args.consume_rabbitmq), (None, None));
        assert_eq!(args.dedupe, Dedupe::On);
        let args =
            DemoArgs::try_from_iter(["demo", "--dedupe", "off", "--nats-ack-wait", "2s"]).unwrap();
        assert_eq!(
            (args.dedupe, args.nats_ack_wait),
            (Dedupe::Off, Duration::from_secs(2))
        );
        let args =
            DemoArgs::try_from_iter(["demo", "--pause-after-step", "consumed-charge"]).unwrap();
        assert_eq!(args.pause_after_step.as_deref(), Some("consumed-charge"));
    }

    #[test]
    fn a_database_url_flag_is_named_as_its_source() {
        let args = DemoArgs::try_from_iter(["demo", "--database-url", "sqlite://x.db"]).unwrap();
        assert_eq!(args.database_url_from, DatabaseUrlFrom::Flag);
    }
}
