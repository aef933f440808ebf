//! The payments demo's charge consumer: charge commands from a NATS JetStream stream
//! ([`nats`], feature `nats`, `--consume-nats`) and from a RabbitMQ queue ([`rabbitmq`],
//! feature `rabbitmq`, `--consume-rabbitmq`), each through the library's door for its
//! broker (`JetStreamDoor`, `RabbitDoor`) running one function, [`Charges::charge_once`],
//! whichever broker it came from.
//!
//! A command is JSON, its id chosen by the publisher and the same on every delivery:
//! `{"id": "cmd_1", "account": "acct_alice", "amount": 10000, "currency": "BRL"}`. Handled,
//! keyed by its `id` ([`command_id`], the doors' `key_from`: a body that is not a command
//! has no key, and the door rejects it), it
//!
//! 1. charges the gateway under `key.derive("charge")`: the same downstream key on every
//!    delivery of the command, so the gateway charges once. The call itself is at least
//!    once: a crash after the gateway answered and before the record commits makes the
//!    redelivery call again, with the same key, and the gateway answers with its first
//!    charge;
//! 2. writes one row in `demo_consumed_charges` in the transaction the command's record
//!    commits in (a transactional inbox, the doors' `run_in_transaction`): the row and
//!    the record commit together or not at all, so each command id has one row, exactly
//!    once, however often and wherever it is delivered.
//!
//! The doors answer the broker as the outcome's
//! [`disposition`](idempotent_runtime::Outcome::disposition) says, and log one line per
//! delivery (`key=… outcome=…`): acknowledged once the record is committed (or
//! replayed), redelivered after the lease left while another delivery runs it, rejected
//! when its id was used for another command.
//!
//! `--dedupe off` runs every delivery as a consumer without this library would (for the
//! tests that show what the protection prevents), in a plain loop of its own: no record,
//! the row written on its own, and a gateway key of the delivery's own, so a redelivery
//! charges and writes again.

#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;

use std::sync::Arc;
use std::time::Duration;

use idempotent_runtime::transaction::TxDatabase;
use idempotent_runtime::{HandlerConfig, Idempotency, IdempotencyKey, Tx};
use serde::{Deserialize, Serialize};

use crate::cli::DemoArgs;
use crate::database::{self, Database};
use crate::gateway::api::GatewayClient;
use crate::gateway::{self, Gateway, GatewayError};
use crate::payments::PauseAfterStep;
use crate::serve::BoxError;

/// The scope of the commands' records: command ids are unique among charge commands,
/// whichever broker carries them.
pub const SCOPE: &str = "charge_commands";

/// The step `--pause-after-step` names to stop a consumed command after its gateway call
/// and its row, before the row and the record commit.
pub const PAUSE_POINT: &str = "consumed-charge";

/// The engine's defaults (`--lease`, `--ttl`), under the name the metrics and logs show.
pub const CONFIG: HandlerConfig = HandlerConfig::new().name("charge_command");

/// How long a failed delivery (the gateway down, the database away) waits before it is
/// delivered again.
pub const RETRY_DELAY: Duration = Duration::from_secs(1);

/// A command to charge an account, as the publisher sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargeCommand {
    /// The publisher's id of the command, the same on every delivery: the idempotency key.
    pub id: String,
    /// The account to charge.
    pub account: String,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217 code.
    pub currency: String,
}

/// What a handled command came to: its output, recorded and replayed to every
/// redelivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charged {
    /// The gateway's charge (`pay_…`).
    pub charge: String,
    /// `succeeded` or `declined`.
    pub status: String,
    /// The ledger row written for it (`led_…`); none for a declined card.
    pub entry: Option<String>,
}

/// Why a command was not handled this time; its claim is released and the delivery
/// redelivered.
#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    /// The gateway is down, unreachable, or answered what its API does not.
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    /// Writing the ledger row failed.
    #[error("writing the ledger row failed: {0}")]
    Ledger(#[from] sqlx::Error),
    /// The body is not a charge command (the doors reject such a body before it runs, as
    /// one without a key).
    #[error("not a charge command: {0}")]
    NotACommand(#[from] serde_json::Error),
}

/// The key of a delivery whose body is `body`: its command's id; `None` when it is not a
/// charge command (the door rejects it, as a delivery without a key).
pub fn command_id(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<ChargeCommand>(body)
        .ok()
        .map(|command| command.id)
}

/// Whether the consumer runs each command once per id (`on`, the default) or runs every
/// delivery as it comes (`off`, to show what the protection prevents).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Dedupe {
    /// Once per command id: the record and the inbox row commit together, the gateway
    /// gets a key derived from the id.
    #[default]
    On,
    /// Every delivery runs: the row is written on its own and the gateway gets a key of
    /// the delivery's own, as a consumer without idempotency keys would.
    Off,
}

/// The charge consumer's handler: what it charges through, where it writes, and how.
#[derive(Debug, Clone)]
pub struct Charges {
    idempotency: Idempotency,
    gateway: GatewayClient,
    db: Database,
    /// [`INSERT_ROW`] in `db`'s dialect.
    insert: Arc<str>,
    pause: PauseAfterStep,
    dedupe: Dedupe,
}

/// The rows the consumer writes, one per command handled. No unique constraint on
/// `command_id`, on purpose: the inbox alone keeps a command to one row, and the tests
/// count them.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS demo_consumed_charges (
    id TEXT PRIMARY KEY,
    command_id TEXT NOT NULL,
    charge_id TEXT NOT NULL,
    account TEXT NOT NULL,
    amount BIGINT NOT NULL,
    currency TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS demo_consumed_charges_command ON demo_consumed_charges (command_id)
";

/// [`SCHEMA`] for MySQL, which indexes no `TEXT` without a length.
#[cfg(feature = "mysql")]
const SCHEMA_MYSQL: &str = "
CREATE TABLE IF NOT EXISTS demo_consumed_charges (
    id VARCHAR(64) PRIMARY KEY,
    command_id VARCHAR(255) NOT NULL,
    charge_id VARCHAR(64) NOT NULL,
    account VARCHAR(255) NOT NULL,
    amount BIGINT NOT NULL,
    currency VARCHAR(16) NOT NULL,
    created_at BIGINT NOT NULL,
    INDEX demo_consumed_charges_command (command_id)
)
";

/// Inserts one row (`$N` placeholders: passed through [`Database::dialect`]).
const INSERT_ROW: &str = "INSERT INTO demo_consumed_charges \
    (id, command_id, charge_id, account, amount, currency, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7)";

impl Charges {
    /// The handler over `db` (its table created if missing), which must be where
    /// `idempotency` keeps its records: the rows commit with them.
    pub async fn new(
        idempotency: Idempotency,
        gateway: GatewayClient,
        db: Database,
        pause: PauseAfterStep,
        dedupe: Dedupe,
    ) -> Result<Self, sqlx::Error> {
        let schema = match &db {
            #[cfg(feature = "mysql")]
            Database::MySql(_) => SCHEMA_MYSQL,
            _ => SCHEMA,
        };
        db.execute_script(schema).await?;
        let insert = db.dialect(INSERT_ROW).into();
        Ok(Self {
            idempotency,
            gateway,
            db,
            insert,
            pause,
            dedupe,
        })
    }

    /// The engine the doors run the commands through.
    pub fn idempotency(&self) -> &Idempotency {
        &self.idempotency
    }

    /// The database the rows (and the commands' records) are written to.
    pub fn database(&self) -> &Database {
        &self.db
    }

    /// Whether each command runs once per id or every delivery runs.
    pub fn dedupe(&self) -> Dedupe {
        self.dedupe
    }

    /// The function every door runs, once per command id: charges the gateway under
    /// `key.derive("charge")` and writes the command's row in `tx`, the transaction its
    /// record commits in.
    pub async fn charge_once<DB>(
        &self,
        key: &IdempotencyKey,
        body: &[u8],
        tx: &mut Tx<DB>,
    ) -> Result<Charged, ChargeError>
    where
        DB: TxDatabase,
        for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
        DB::Arguments: sqlx::IntoArguments<DB>,
        for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        let command: ChargeCommand = serde_json::from_slice(body)?;
        self.charge::<DB>(&command, &key.derive("charge"), tx.conn())
            .await
    }

    /// Runs the delivery whose body is `body` as it comes (`--dedupe off`): a gateway key
    /// of its own, the row on its own; logs what it came to, one line per delivery.
    pub async fn charge_every_delivery(&self, body: &[u8]) -> Result<Charged, ChargeError> {
        let command: ChargeCommand = match serde_json::from_slice(body) {
            Ok(command) => command,
            Err(error) => {
                tracing::warn!(%error, "not a charge command; rejecting it");
                return Err(error.into());
            }
        };
        let charged = crate::on_pool!(&self.db, |pool| self.every_delivery(pool, &command).await);
        match &charged {
            Ok(charged) => {
                tracing::info!(command = %command.id, outcome = %"ran", charge = %charged.charge, "acknowledged")
            }
            Err(error) => {
                tracing::info!(command = %command.id, %error, "failed; to be redelivered")
            }
        }
        charged
    }

    /// [`charge_every_delivery`](Self::charge_every_delivery) on the database `pool`
    /// belongs to.
    async fn every_delivery<DB>(
        &self,
        pool: &sqlx::Pool<DB>,
        command: &ChargeCommand,
    ) -> Result<Charged, ChargeError>
    where
        DB: TxDatabase,
        for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
        DB::Arguments: sqlx::IntoArguments<DB>,
        for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        let gateway_key = format!("{}-{:016x}", command.id, rand::random::<u64>());
        let mut conn = pool.acquire().await?;
        self.charge::<DB>(command, &gateway_key, &mut conn).await
    }

    /// Charges the command's account under `gateway_key`, then writes its row on `conn`.
    async fn charge<DB>(
        &self,
        command: &ChargeCommand,
        gateway_key: &str,
        conn: &mut DB::Connection,
    ) -> Result<Charged, ChargeError>
    where
        DB: TxDatabase,
        for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
        DB::Arguments: sqlx::IntoArguments<DB>,
        for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        let charged = self
            .gateway
            .charge(
                &command.account,
                command.amount,
                &command.currency,
                gateway_key,
            )
            .await;
        let charge = match charged {
            Ok(charge) => charge,
            // A declined card is the command's outcome: recorded and replayed, no row.
            Err(GatewayError::Declined(charge)) => {
                return Ok(Charged {
                    charge: charge.id,
                    status: charge.status,
                    entry: None,
                });
            }
            Err(error) => return Err(error.into()),
        };
        let entry = format!("led_{:016x}", rand::random::<u64>());
        sqlx::query::<DB>(sqlx::AssertSqlSafe(self.insert.to_string()))
            .bind(entry.clone())
            .bind(command.id.clone())
            .bind(charge.id.clone())
            .bind(command.account.clone())
            .bind(command.amount)
            .bind(command.currency.clone())
            .bind(crate::ledger::now_millis())
            .execute(&mut *conn)
            .await?;
        self.pause.after(PAUSE_POINT).await;
        Ok(Charged {
            charge: charge.id,
            status: charge.status,
            entry: Some(entry),
        })
    }
}

/// Starts the consumers `args` asks for (`--consume-nats`, `--consume-rabbitmq`), each in
/// a task of its own, once connected; nothing when neither is set.
///
/// With an SQLite store the consumer's gateway keeps its charges in
/// `--gateway-database-url` (a fake provider of its own, on loopback): the inbox holds the
/// file's one write lock while a command runs, gateway call included.
///
/// # Errors
///
/// A broker refused the connection or the subscription; the store is Redis (the rows
/// commit with the records, in the store's own database); the demo was built without the
/// broker's feature.
pub async fn start(
    args: &DemoArgs,
    idempotency: &Idempotency,
    gateway: &GatewayClient,
    db: &Database,
) -> Result<(), BoxError> {
    if args.consume_nats.is_none() && args.consume_rabbitmq.is_none() {
        return Ok(());
    }
    if database::is_key_value_store(&args.database_url) {
        return Err(
            "the charge consumer writes its rows in the store's own database, \
                    with the commands' records: use an SQL store (sqlite://, postgres://, \
                    mysql://), not Redis"
                .into(),
        );
    }
    let gateway = match db {
        // The inbox holds an SQLite file's one write lock while the function runs, so a
        // gateway writing to the same file would wait for it until its busy timeout; a
        // provider keeps a database of its own, and so does the consumer's fake one here.
        Database::Sqlite(_) => {
            let charges_db = database::open_tables(&args.gateway_database_url).await?;
            let own = Gateway::new(charges_db, args.gateway_latency())
                .await?
                .with_keys(args.gateway_keys);
            let addr = gateway::api::serve(own, ([127, 0, 0, 1], 0).into()).await?;
            tracing::info!(%addr, database = %database::redact_url(&args.gateway_database_url),
                "the charge consumer's fake gateway listens");
            GatewayClient::new(addr)
        }
        #[allow(unreachable_patterns)] // a build with SQLite alone
        _ => gateway.clone(),
    };
    let charges = Charges::new(
        idempotency.clone(),
        gateway,
        db.clone(),
        PauseAfterStep::new(args.pause_after_step.as_deref()),
        args.dedupe,
    )
    .await?;
    if args.dedupe == Dedupe::Off {
        tracing::warn!("--dedupe off: every delivery of a charge command charges and writes");
    }
    if let Some(url) = &args.consume_nats {
        #[cfg(feature = "nats")]
        {
            let consumer = nats::subscribe(url, &args.nats_stream, args.nats_ack_wait).await?;
            tracing::info!(stream = %args.nats_stream, "consuming charge commands from NATS");
            tokio::spawn(nats::run(
                consumer,
                charges.clone(),
                args.consumer_concurrency,
            ));
        }
        #[cfg(not(feature = "nats"))]
        {
            let _ = url;
            return Err("--consume-nats: this demo was built without the `nats` feature".into());
        }
    }
    if let Some(url) = &args.consume_rabbitmq {
        #[cfg(feature = "rabbitmq")]
        {
            let consumer =
                rabbitmq::subscribe(url, &args.rabbitmq_queue, args.consumer_concurrency).await?;
            tracing::info!(queue = %args.rabbitmq_queue, "consuming charge commands from RabbitMQ");
            tokio::spawn(rabbitmq::run(consumer, charges, args.consumer_concurrency));
        }
        #[cfg(not(feature = "rabbitmq"))]
        {
            let _ = (url, charges);
            return Err(
                "--consume-rabbitmq: this demo was built without the `rabbitmq` feature".into(),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use idempotent_runtime::{Fingerprint, Outcome};

    use super::*;

    /// The handler on an SQLite store in `dir`, its gateway on a file of its own; and the
    /// store's pool, to count the rows.
    async fn charges(dir: &std::path::Path, dedupe: Dedupe) -> (Charges, sqlx::SqlitePool) {
        let url = format!("sqlite://{}", dir.join("payments.db").display());
        let (db, store) = database::open(&url).await.expect("open the store");
        let gateway_db =
            database::open_tables(&format!("sqlite://{}", dir.join("gateway.db").display()))
                .await
                .expect("open the gateway's file");
        let gateway = Gateway::new(gateway_db, Duration::ZERO)
            .await
            .expect("gateway schema");
        let addr = gateway::api::serve(gateway, ([127, 0, 0, 1], 0).into())
            .await
            .expect("serve the gateway");
        #[allow(irrefutable_let_patterns)] // a build with SQLite alone
        let Database::Sqlite(pool) = db.clone() else {
            unreachable!("an sqlite:// URL")
        };
        let idempotency = Idempotency::builder_shared(store).build();
        let charges = Charges::new(
            idempotency,
            GatewayClient::new(addr),
            db,
            PauseAfterStep::default(),
            dedupe,
        )
        .await
        .expect("the consumer's table");
        (charges, pool)
    }

    async fn rows(pool: &sqlx::SqlitePool, command: &str) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM demo_consumed_charges WHERE command_id = $1")
            .bind(command)
            .fetch_one(pool)
            .await
            .expect("count rows")
    }

    const COMMAND: &str = r#"{"id":"cmd_1","account":"acct_a","amount":10000,"currency":"BRL"}"#;

    /// Runs [`Charges::charge_once`] for `body` under its command id, as the doors do.
    async fn once(charges: &Charges, body: &str) -> Outcome<Charged, ChargeError> {
        let id = command_id(body.as_bytes()).expect("a command");
        let charges_for_run = charges.clone();
        let body = body.to_owned();
        charges
            .idempotency()
            .once_in_transaction(
                &CONFIG,
                SCOPE,
                &id,
                Fingerprint::of_payload(body.as_bytes()),
                async move |key, tx: &mut Tx<sqlx::Sqlite>| {
                    charges_for_run.charge_once(&key, body.as_bytes(), tx).await
                },
            )
            .await
    }

    #[test]
    fn the_key_is_the_command_id_and_anything_else_has_none() {
        assert_eq!(command_id(COMMAND.as_bytes()).as_deref(), Some("cmd_1"));
        assert_eq!(
            command_id(br#"{"id":"cmd_1"}"#),
            None,
            "not a whole command"
        );
        assert_eq!(command_id(b"not a command"), None);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_shared_function_writes_one_row_per_command_id() {
        let dir = tempfile::tempdir().unwrap();
        let (charges, pool) = charges(dir.path(), Dedupe::On).await;
        assert!(matches!(once(&charges, COMMAND).await, Outcome::Ran(_)));
        assert!(matches!(
            once(&charges, COMMAND).await,
            Outcome::Replayed(_)
        ));
        assert_eq!(rows(&pool, "cmd_1").await, 1);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn without_dedupe_every_delivery_writes_a_row() {
        let dir = tempfile::tempdir().unwrap();
        let (charges, pool) = charges(dir.path(), Dedupe::Off).await;
        for _delivery in 0..2 {
            charges
                .charge_every_delivery(COMMAND.as_bytes())
                .await
                .expect("charged");
        }
        assert_eq!(rows(&pool, "cmd_1").await, 2);
        assert!(matches!(
            charges.charge_every_delivery(b"not a command").await,
            Err(ChargeError::NotACommand(_))
        ));
    }

    /// The gateway down (its magic amount): the function fails, its row rolled back.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_gateway_outage_fails_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (charges, pool) = charges(dir.path(), Dedupe::On).await;
        let down = COMMAND.replace("10000", &crate::gateway::UNAVAILABLE_AMOUNT.to_string());
        assert!(matches!(once(&charges, &down).await, Outcome::Failed(_)));
        assert_eq!(rows(&pool, "cmd_1").await, 0);
    }
}
