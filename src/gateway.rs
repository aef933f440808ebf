//! A fake payment gateway that behaves like a provider's test mode: it takes an
//! idempotency key of its own (the derived downstream key), persists every charge it
//! answers in the demo's database, and has magic amounts.
//!
//! - `40200`: the card is declined; the declined charge is recorded.
//! - `50300`: the gateway is unavailable; nothing is recorded.
//! - anything else succeeds.
//!
//! A second call with the same downstream key returns the first charge, as a real
//! provider does, so a retry after a crash is deduplicated downstream too — unless the
//! gateway is told to ignore keys ([`KeyHandling::Ignore`], `--gateway-keys ignore`),
//! like a provider that takes none: then every call charges anew, and the key is only a
//! reference that charges can be looked up by ([`Gateway::find_by_reference`]).
//!
//! Every call that authorises or declines a charge, deduplicated or not, is also a line in
//! the [`EffectsLog`] when the demo has one (`--effects-log`), so that a test can count
//! the provider's effects across a `kill -9` of the process.
//!
//! The demo's handler reaches the gateway over HTTP, as it would a real provider: [`api`]
//! serves it on loopback and is the demo's client of it, through `idempotent-client`.

pub mod api;

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, Row};

use crate::database::Database;
use crate::on_pool;

/// The amount the gateway declines.
pub const DECLINED_AMOUNT: i64 = 40_200;
/// The amount at which the gateway is unavailable.
pub const UNAVAILABLE_AMOUNT: i64 = 50_300;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS demo_charges (
    id TEXT PRIMARY KEY,
    account TEXT NOT NULL,
    amount BIGINT NOT NULL,
    currency TEXT NOT NULL,
    status TEXT NOT NULL,
    downstream_key TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS demo_charges_account ON demo_charges (account, created_at);
CREATE TABLE IF NOT EXISTS demo_gateway_calls (
    downstream_key TEXT NOT NULL,
    amount BIGINT NOT NULL,
    called_at BIGINT NOT NULL
)
";

/// [`SCHEMA`] for MySQL, which indexes no `TEXT` without a length (and has no
/// `CREATE INDEX IF NOT EXISTS` before MariaDB).
#[cfg(feature = "mysql")]
const SCHEMA_MYSQL: &str = "
CREATE TABLE IF NOT EXISTS demo_charges (
    id VARCHAR(64) PRIMARY KEY,
    account VARCHAR(255) NOT NULL,
    amount BIGINT NOT NULL,
    currency VARCHAR(16) NOT NULL,
    status VARCHAR(16) NOT NULL,
    downstream_key VARCHAR(255) NOT NULL UNIQUE,
    created_at BIGINT NOT NULL,
    INDEX demo_charges_account (account, created_at)
);
CREATE TABLE IF NOT EXISTS demo_gateway_calls (
    downstream_key VARCHAR(255) NOT NULL,
    amount BIGINT NOT NULL,
    called_at BIGINT NOT NULL
)
";

/// Records a charge unless its downstream key has one (then nothing is written).
const INSERT_CHARGE: &str =
    "INSERT INTO demo_charges (id, account, amount, currency, status, downstream_key, created_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (downstream_key) DO NOTHING";

/// [`INSERT_CHARGE`] for MySQL (`IGNORE` skips the duplicate downstream key).
#[cfg(feature = "mysql")]
const INSERT_CHARGE_MYSQL: &str = "INSERT IGNORE INTO demo_charges (id, account, amount, currency, status, downstream_key, created_at)
     VALUES (?, ?, ?, ?, ?, ?, ?)";

/// A charge as the gateway recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// `pay_…`
    pub id: String,
    /// The charged account (the API caller).
    pub account: String,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// `succeeded` or `declined`.
    pub status: String,
    /// The idempotency key the gateway was called with.
    pub downstream_key: String,
}

/// Why a charge did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The card was declined; the charge is recorded.
    #[error("card declined")]
    Declined(Charge),
    /// The gateway is unavailable; nothing was recorded.
    #[error("payment gateway unavailable")]
    Unavailable,
    /// The gateway's ledger failed.
    #[error("gateway ledger error: {0}")]
    Ledger(#[from] sqlx::Error),
    /// Appending the call to the effects log failed (the charge itself is recorded).
    #[error("effects log error: {0}")]
    EffectsLog(#[from] std::io::Error),
    /// The gateway gave no answer within the client's attempts and deadline: whether it
    /// charged is unknown, and a retry with the same downstream key charges at most once.
    #[error("payment gateway unreachable: {0}")]
    Unreachable(String),
    /// The gateway answered something its API does not (a `400`, a `500`, a body that is
    /// not a charge).
    #[error("unexpected answer from the payment gateway: {0}")]
    Protocol(String),
}

/// Whether the gateway deduplicates calls by their key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyHandling {
    /// A call with a key the gateway has seen answers that key's charge (a provider with
    /// idempotency keys).
    #[default]
    Honour,
    /// Every call charges anew; the key is kept as the charge's reference (a provider
    /// without idempotency keys).
    Ignore,
}

/// The fake gateway.
#[derive(Debug, Clone)]
pub struct Gateway {
    db: Database,
    latency: Duration,
    effects: EffectsLog,
    keys: KeyHandling,
}

/// An append-only file of the fake providers' external effects, one line each
/// (`authorised pay_… idem_…`, `receipt_sent pay_… rcpt_…`), shared by every process of a
/// demo that names it; or nothing, when the demo runs without `--effects-log`.
///
/// The file is opened with `O_APPEND` and each line is one `write`: lines from several
/// processes do not interleave, and a line written before a `kill -9` is in the page
/// cache, so the next process and the test read it.
#[derive(Debug, Clone, Default)]
pub struct EffectsLog {
    file: Option<Arc<std::fs::File>>,
}

impl EffectsLog {
    /// The log at `path` (created if missing, appended to if not), or no log for `None`.
    pub fn open(path: Option<&Path>) -> std::io::Result<Self> {
        let file = match path {
            Some(path) => Some(Arc::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            )),
            None => None,
        };
        Ok(Self { file })
    }

    /// Appends `line` and a newline in one write; nothing without a log.
    pub fn append(&self, line: &str) -> std::io::Result<()> {
        match &self.file {
            Some(file) => (&**file).write_all(format!("{line}\n").as_bytes()),
            None => Ok(()),
        }
    }
}

impl Gateway {
    /// A gateway keeping its ledger in `db` (table created if missing).
    pub async fn new(db: Database, latency: Duration) -> Result<Self, sqlx::Error> {
        let schema = match &db {
            #[cfg(feature = "mysql")]
            Database::MySql(_) => SCHEMA_MYSQL,
            _ => SCHEMA,
        };
        db.execute_script(schema).await?;
        Ok(Self {
            db,
            latency,
            effects: EffectsLog::default(),
            keys: KeyHandling::default(),
        })
    }

    /// This gateway, deduplicating calls by their key or not.
    pub fn with_keys(mut self, keys: KeyHandling) -> Self {
        self.keys = keys;
        self
    }

    /// This gateway, appending a line to `effects` for every call that authorises or
    /// declines a charge.
    pub fn with_effects_log(mut self, effects: EffectsLog) -> Self {
        self.effects = effects;
        self
    }

    /// Charges `amount` to `account`, deduplicated by `downstream_key`: answers the charge
    /// and whether it is new (`false`: an earlier call with `downstream_key` made it).
    pub async fn charge(
        &self,
        account: &str,
        amount: i64,
        currency: &str,
        downstream_key: &str,
    ) -> Result<(Charge, bool), GatewayError> {
        tokio::time::sleep(self.latency).await;
        if amount == UNAVAILABLE_AMOUNT {
            return Err(GatewayError::Unavailable);
        }
        let status = if amount == DECLINED_AMOUNT {
            "declined"
        } else {
            "succeeded"
        };
        let id = format!("pay_{:016x}", rand::rng().random::<u64>());
        // Ignoring keys, each call is a charge of its own, found by the key as a prefix.
        let stored_key = match self.keys {
            KeyHandling::Honour => downstream_key.to_owned(),
            KeyHandling::Ignore => format!("{downstream_key}{REFERENCE_SEPARATOR}{id}"),
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        // Every call that reaches the ledger is logged, deduplicated or not, so tests can
        // tell "charged once" from "asked to charge many times, deduplicated downstream".
        const LOG_CALL: &str = "INSERT INTO demo_gateway_calls (downstream_key, amount, called_at) VALUES ($1, $2, $3)";
        let log_call = self.db.dialect(LOG_CALL);
        on_pool!(&self.db, |pool| sqlx::query(AssertSqlSafe(
            log_call.as_str()
        ))
        .bind(downstream_key)
        .bind(amount)
        .bind(now)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?;
        let insert = match &self.db {
            #[cfg(feature = "mysql")]
            Database::MySql(_) => INSERT_CHARGE_MYSQL,
            _ => INSERT_CHARGE,
        };
        let inserted = on_pool!(&self.db, |pool| sqlx::query(insert)
            .bind(&id)
            .bind(account)
            .bind(amount)
            .bind(currency)
            .bind(status)
            .bind(&stored_key)
            .bind(now)
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))?;
        let charge = self
            .find("downstream_key = $1", &stored_key)
            .await?
            .into_iter()
            .next()
            .ok_or(sqlx::Error::RowNotFound)?;
        // Deduplicated calls are effects too: a handler that asked twice is what a test of
        // recovery points must see.
        let effect = match charge.status.as_str() {
            "declined" => "declined",
            _ => "authorised",
        };
        self.effects
            .append(&format!("{effect} {} {downstream_key}", charge.id))?;
        // What a provider's dashboard would show: a new charge, or a call answered with
        // the charge an earlier call with the same downstream key made.
        if inserted == 1 {
            tracing::info!(charge = %charge.id, amount, %currency, "new charge");
        } else {
            tracing::info!(
                charge = %charge.id,
                "same downstream key as an earlier call: answered with its charge"
            );
        }
        if charge.status == "declined" {
            return Err(GatewayError::Declined(charge));
        }
        Ok((charge, inserted == 1))
    }

    /// The charges made under `reference` (the key the calls carried), oldest first: one
    /// when the gateway honours keys, one per call when it ignores them.
    pub async fn find_by_reference(&self, reference: &str) -> Result<Vec<Charge>, sqlx::Error> {
        // `~` is the separator, and `\x7f` the next character: the range is the prefix.
        let sql = self.db.dialect(
            "SELECT id, account, amount, currency, status, downstream_key FROM demo_charges \
             WHERE downstream_key = $1 OR (downstream_key > $2 AND downstream_key < $3) \
             ORDER BY created_at, id",
        );
        let (low, high) = (
            format!("{reference}{REFERENCE_SEPARATOR}"),
            format!("{reference}\u{7f}"),
        );
        on_pool!(&self.db, |pool| {
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
                .bind(reference)
                .bind(&low)
                .bind(&high)
                .fetch_all(pool)
                .await?;
            rows.iter().map(charge_of).collect()
        })
    }

    /// The account's charges, oldest first.
    pub async fn list(&self, account: &str) -> Result<Vec<Charge>, sqlx::Error> {
        self.find("account = $1", account).await
    }

    /// One of the account's charges.
    pub async fn get(&self, account: &str, id: &str) -> Result<Option<Charge>, sqlx::Error> {
        Ok(self
            .find("id = $1", id)
            .await?
            .into_iter()
            .find(|c| c.account == account))
    }

    /// How many charge calls reached the gateway's ledger, including those it answered
    /// from an earlier charge with the same downstream key (for tests and operators).
    pub async fn calls(&self) -> Result<i64, sqlx::Error> {
        const SQL: &str = "SELECT COUNT(*) FROM demo_gateway_calls";
        on_pool!(&self.db, |pool| sqlx::query_scalar(SQL)
            .fetch_one(pool)
            .await)
    }

    /// Every charge of every account (for tests and operators).
    pub async fn all(&self) -> Result<Vec<Charge>, sqlx::Error> {
        self.find("1 = 1 OR $1 = ''", "").await
    }

    async fn find(&self, condition: &'static str, value: &str) -> Result<Vec<Charge>, sqlx::Error> {
        let sql = self.db.dialect(&format!(
            "SELECT id, account, amount, currency, status, downstream_key FROM demo_charges \
             WHERE {condition} ORDER BY created_at, id"
        ));
        on_pool!(&self.db, |pool| {
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
                .bind(value)
                .fetch_all(pool)
                .await?;
            rows.iter().map(charge_of).collect()
        })
    }
}

/// Between a key and the charge id in the stored key of a gateway that ignores keys.
const REFERENCE_SEPARATOR: char = '~';

/// The charge a `demo_charges` row holds.
fn charge_of<R: Row>(row: &R) -> Result<Charge, sqlx::Error>
where
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(Charge {
        id: row.try_get("id")?,
        account: row.try_get("account")?,
        amount: row.try_get("amount")?,
        currency: row.try_get("currency")?,
        status: row.try_get("status")?,
        downstream_key: row.try_get("downstream_key")?,
    })
}
