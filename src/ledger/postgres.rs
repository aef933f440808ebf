//! The ledger app ([`crate::ledger`], SQLite) on Postgres, so its tests cover every SQL
//! database: the same deposit handler with `Tx<Postgres>`, the same routes on a `PgPool`.
//! The `ledger-demo` binary runs it for a `postgres://` URL (so the crash tests can run it
//! on Postgres).

use std::time::Duration;

use axum::extract::{FromRef, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idempotent_runtime::rejection::AsProblem;
use idempotent_runtime::store::PostgresStore;
use idempotent_runtime::{Idempotency, Postgres, Tx, idempotent};
use sqlx::PgPool;

use crate::auth::Caller;
use crate::cli::DemoArgs;
use crate::ledger::{
    BALANCE, BANNER, Balance, DepositRequest, Entry, INSERT_ENTRY, LedgerError, SCHEMA,
    crash_if_asked, now_millis,
};
use crate::serve::{self, BoxError};

/// The router state: the engine, and the database it shares with the ledger.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The idempotency engine; its store is in `db`, so a deposit and its response can
    /// commit together.
    pub idempotency: Idempotency,
    /// The database holding the ledger and the idempotency records.
    pub db: PgPool,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.idempotency.clone()
    }
}

impl FromRef<AppState> for PgPool {
    fn from_ref(state: &AppState) -> Self {
        state.db.clone()
    }
}

/// The ledger API on Postgres.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/deposits", post(deposit))
        .route("/balance", get(balance))
        .with_state(state)
}

/// The example's `deposit`, with `Tx<Postgres>`.
#[idempotent(scope = caller)]
async fn deposit(
    caller: Caller,
    tx: &mut Tx<Postgres>,
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

/// The example's `balance`, on a `PgPool`.
async fn balance(caller: Caller, State(db): State<PgPool>) -> Result<Json<Balance>, LedgerError> {
    let (balance, entries) = sqlx::query_as(BALANCE)
        .bind(caller.account())
        .fetch_one(&db)
        .await?;
    Ok(Json(Balance { balance, entries }))
}

/// The example's `run`, on Postgres.
pub async fn run(args: DemoArgs) -> Result<(), BoxError> {
    crate::database::wait_until_reachable(&args.database_url, args.database_wait).await?;
    let store = PostgresStore::connect(&args.database_url).await?;
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
