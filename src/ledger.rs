//! The ledger demo (DESIGN §5): deposits whose ledger rows live in the same database as
//! the idempotency store and commit in one transaction with the stored response.
//!
//! - `POST /deposits` `{"amount": 500}` — requires `Idempotency-Key`; inserts one ledger
//!   row for the caller and answers `201` with the entry;
//! - `GET /balance` — `{"balance": n, "entries": k}` for the caller.
//!
//! Fault injection: with `LEDGER_CRASH_AFTER_WRITE=1` in its environment the process
//! aborts after writing a deposit's ledger row and before the transaction commits, to
//! show that a crash there leaves no row behind (the crash tests use it).

use axum::extract::{FromRef, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::{HeaderValue, StatusCode, header};
#[cfg(feature = "postgres")]
use idempotent_runtime::Postgres;
use idempotent_runtime::{Idempotency, Sqlite, Tx, idempotent};
use rand::Rng;
use serde::{Deserialize, Serialize};
use sqlx::Row;

use crate::auth::Caller;
use crate::database::Database;
use crate::on_pool;
use crate::payments::ApiError;

/// The environment variable that makes the demo abort between a write and its commit.
pub const CRASH_AFTER_WRITE_ENV: &str = "LEDGER_CRASH_AFTER_WRITE";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS demo_ledger (
    id TEXT PRIMARY KEY,
    account TEXT NOT NULL,
    amount BIGINT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS demo_ledger_account ON demo_ledger (account)
";

/// The router state of the ledger.
#[derive(Debug, Clone)]
pub struct LedgerState {
    /// The idempotency engine; its store is in `db`.
    pub idempotency: Idempotency,
    /// The database holding the ledger and the idempotency records.
    pub db: Database,
}

impl FromRef<LedgerState> for Idempotency {
    fn from_ref(state: &LedgerState) -> Self {
        state.idempotency.clone()
    }
}

/// Creates the ledger table if missing.
pub async fn migrate(db: &Database) -> Result<(), sqlx::Error> {
    db.execute_script(SCHEMA).await
}

/// The ledger API over `state.db` (SQLite or Postgres).
pub fn router(state: LedgerState) -> Router {
    let deposits = match &state.db {
        Database::Sqlite(_) => post(deposit_sqlite),
        #[cfg(feature = "postgres")]
        Database::Postgres(_) => post(deposit_postgres),
    };
    Router::new()
        .route("/deposits", deposits)
        .route("/balance", get(balance))
        .with_state(state)
}

/// The body of `POST /deposits`.
#[derive(Debug, Clone, Deserialize)]
pub struct DepositRequest {
    /// Minor units; a positive integer.
    #[serde(default)]
    pub amount: serde_json::Value,
}

/// A ledger entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// `dep_…`
    pub id: String,
    /// The account credited.
    pub account: String,
    /// Minor units.
    pub amount: i64,
}

/// `{"balance": n, "entries": k}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Balance {
    /// Sum of the caller's entries.
    pub balance: i64,
    /// Number of the caller's entries.
    pub entries: i64,
}

/// Validates a deposit and builds its entry; `Err` is the `400` to answer.
fn entry_for(caller: &Caller, request: &DepositRequest) -> Result<Entry, ApiError> {
    let amount = request.amount.as_i64().filter(|a| *a > 0).ok_or_else(|| {
        ApiError::Invalid("amount must be a positive integer in minor units, e.g. 500".into())
    })?;
    Ok(Entry {
        id: format!("dep_{:016x}", rand::rng().random::<u64>()),
        account: caller.account().to_owned(),
        amount,
    })
}

const INSERT_ENTRY: &str =
    "INSERT INTO demo_ledger (id, account, amount, created_at) VALUES ($1, $2, $3, $4)";

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn created(entry: Entry) -> Response {
    let location =
        HeaderValue::try_from(format!("/deposits/{}", entry.id)).expect("ids are header-safe");
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(entry),
    )
        .into_response()
}

fn crash_if_asked() {
    static CRASH: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *CRASH.get_or_init(|| std::env::var(CRASH_AFTER_WRITE_ENV).is_ok_and(|v| v == "1")) {
        eprintln!(
            "ledger demo: aborting after the write, before the commit ({CRASH_AFTER_WRITE_ENV}=1)"
        );
        std::process::abort();
    }
}

/// Defines the `POST /deposits` handler for one database: the ledger row and the stored
/// response commit together. A validation `400` is an `Ok` answer, so it is committed and
/// replayed too; a database error is an `Err` and rolls back.
macro_rules! deposit_handler {
    ($(#[$attr:meta])* $name:ident, $db:ty) => {
        $(#[$attr])*
        #[idempotent(scope = caller)]
        pub async fn $name(
            caller: Caller,
            tx: &mut Tx<$db>,
            Json(request): Json<DepositRequest>,
        ) -> Result<Response, ApiError> {
            let entry = match entry_for(&caller, &request) {
                Ok(entry) => entry,
                Err(invalid) => return Ok(invalid.into_response()),
            };
            sqlx::query(INSERT_ENTRY)
                .bind(&entry.id)
                .bind(&entry.account)
                .bind(entry.amount)
                .bind(now_millis())
                .execute(tx.conn())
                .await?;
            crash_if_asked();
            Ok(created(entry))
        }
    };
}

deposit_handler!(
    /// `POST /deposits` on SQLite.
    deposit_sqlite,
    Sqlite
);

#[cfg(feature = "postgres")]
deposit_handler!(
    /// `POST /deposits` on Postgres.
    deposit_postgres,
    Postgres
);

/// `GET /balance`: the caller's balance and number of entries.
pub async fn balance(
    caller: Caller,
    State(state): State<LedgerState>,
) -> Result<Json<Balance>, ApiError> {
    Ok(Json(balance_of(&state.db, caller.account()).await?))
}

/// The balance of `account`.
pub async fn balance_of(db: &Database, account: &str) -> Result<Balance, sqlx::Error> {
    const SQL: &str = "SELECT CAST(COALESCE(SUM(amount), 0) AS BIGINT) AS balance, COUNT(*) AS entries FROM demo_ledger WHERE account = $1";
    on_pool!(db, |pool| {
        let row = sqlx::query(SQL).bind(account).fetch_one(pool).await?;
        Ok(Balance {
            balance: row.try_get("balance")?,
            entries: row.try_get("entries")?,
        })
    })
}
