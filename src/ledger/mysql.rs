//! The ledger app ([`crate::ledger`], SQLite) on MySQL/MariaDB: the same deposit handler
//! with `Tx<MySql>`, the same routes on a `MySqlPool`, with the statements in MySQL's
//! dialect (`?` placeholders, `SIGNED`, an indexable `VARCHAR` key). The `ledger-demo`
//! binary runs it for a `mysql://` URL (so the crash tests can run it on MySQL).

use std::time::Duration;

use axum::extract::{FromRef, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idempotent_runtime::rejection::AsProblem;
use idempotent_runtime::store::MySqlStore;
use idempotent_runtime::{Idempotency, MySql, Tx, idempotent};
use sqlx::MySqlPool;

use crate::auth::Caller;
use crate::cli::DemoArgs;
use crate::ledger::{
    BANNER, Balance, DepositRequest, Entry, LedgerError, crash_if_asked, now_millis,
};
use crate::serve::{self, BoxError};

/// The example's `SCHEMA` for MySQL.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS demo_ledger (
    id VARCHAR(64) PRIMARY KEY,
    account VARCHAR(255) NOT NULL,
    amount BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    INDEX demo_ledger_account (account)
)
";

/// The example's `INSERT_ENTRY` for MySQL.
pub const INSERT_ENTRY: &str =
    "INSERT INTO demo_ledger (id, account, amount, created_at) VALUES (?, ?, ?, ?)";

/// The example's `BALANCE` for MySQL (`SUM` is a `DECIMAL` there).
pub const BALANCE: &str = "SELECT CAST(COALESCE(SUM(amount), 0) AS SIGNED) AS balance, \
     COUNT(*) AS entries FROM demo_ledger WHERE account = ?";

/// The router state: the engine, and the database it shares with the ledger.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The idempotency engine; its store is in `db`, so a deposit and its response can
    /// commit together.
    pub idempotency: Idempotency,
    /// The database holding the ledger and the idempotency records.
    pub db: MySqlPool,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.idempotency.clone()
    }
}

impl FromRef<AppState> for MySqlPool {
    fn from_ref(state: &AppState) -> Self {
        state.db.clone()
    }
}

/// The ledger API on MySQL.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/deposits", post(deposit))
        .route("/balance", get(balance))
        .with_state(state)
}

/// The example's `deposit`, with `Tx<MySql>`.
#[idempotent(scope = caller)]
async fn deposit(
    caller: Caller,
    tx: &mut Tx<MySql>,
    AsProblem(Json(request)): AsProblem<Json<DepositRequest>>,
) -> Result<Response, LedgerError> {
    let entry = match Entry::new(&caller, &request) {
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
    Ok(entry.created())
}

/// The example's `balance`, on a `MySqlPool`.
async fn balance(
    caller: Caller,
    State(db): State<MySqlPool>,
) -> Result<Json<Balance>, LedgerError> {
    let (balance, entries) = sqlx::query_as(BALANCE)
        .bind(caller.account())
        .fetch_one(&db)
        .await?;
    Ok(Json(Balance { balance, entries }))
}

/// The example's `run`, on MySQL.
pub async fn run(args: DemoArgs) -> Result<(), BoxError> {
    crate::database::wait_until_reachable(&args.database_url, args.database_wait).await?;
    let store = MySqlStore::connect(&args.database_url).await?;
    let db = store.pool().clone();
    sqlx::raw_sql(SCHEMA).execute(&db).await?;
    let idempotency = Idempotency::builder(store)
        .default_lease(args.lease)
        .default_ttl(args.ttl)
        .build();
    let _sweeper = idempotency.spawn_sweeper(Duration::from_secs(60));
    let app = router(AppState {
        idempotency: idempotency.clone(),
        db,
    });
    serve::serve(app, &idempotency, &args, BANNER).await
}
