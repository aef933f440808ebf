//! The ledger demo app on SQLite, served by `cargo run --example ledger` (see `-- --help`
//! for the flags); the `ledger-demo` binary also runs its twins for Postgres
//! ([`postgres`]) and MySQL ([`mysql`]), chosen by the database URL.
//!
//! - `POST /deposits` `{"amount": 500}` — requires `Idempotency-Key`; inserts one ledger
//!   row for the caller and answers `201` with the entry. The row and the stored response
//!   commit in ONE transaction: both or neither;
//! - `GET /balance` — `{"balance": n, "entries": k}` for the caller;
//! - `GET /metrics` — the engine's metrics, Prometheus text ([`crate::prometheus`]).
//! - `GET /openapi.json` — the API in OpenAPI 3.1, `POST /deposits` with its published
//!   idempotency policy.
//!
//! A transactional handler takes `tx: &mut Tx<Sqlite>` and writes through `tx.conn()`;
//! on Postgres it is the same code with `Tx<Postgres>` and a `PgPool`.
//!
//! Fault injection: with `LEDGER_CRASH_AFTER_WRITE=1` in its environment the process
//! aborts after writing a deposit's ledger row and before the transaction commits, to
//! show that a crash there leaves no row behind (the crash tests use it).

use std::time::Duration;

use axum::extract::{FromRef, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::{HeaderValue, StatusCode, header};
use idempotent_runtime::openapi::PublishedPolicy;
use idempotent_runtime::rejection::AsProblem;
use idempotent_runtime::store::SqliteStore;
use idempotent_runtime::{Idempotency, Problem, Sqlite, Tx, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::SqlitePool;
use utoipa::OpenApi;

use crate::amount;
use crate::auth::{BearerAuth, Caller};
use crate::cli::DemoArgs;
use crate::serve::{self, Banner, BoxError};

#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;

/// The router state: the engine, and the database it shares with the ledger.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The idempotency engine; its store is in `db`, so a deposit and its response can
    /// commit together.
    pub idempotency: Idempotency,
    /// The database holding the ledger and the idempotency records.
    pub db: SqlitePool,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.idempotency.clone()
    }
}

impl FromRef<AppState> for SqlitePool {
    fn from_ref(state: &AppState) -> Self {
        state.db.clone()
    }
}

/// The ledger API.
pub fn router(state: AppState) -> Router {
    let doc = Json(openapi(&state.idempotency));
    Router::new()
        .route("/deposits", post(deposit))
        .route("/balance", get(balance))
        .route("/openapi.json", get(move || async move { doc }))
        .with_state(state)
}

/// The operations, as `#[utoipa::path]` describes them.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Ledger demo",
        description = "Deposits committed together with their stored response."
    ),
    paths(deposit, balance),
    modifiers(&BearerAuth)
)]
struct ApiDoc;

/// The OpenAPI document, with the idempotency policy `POST /deposits` runs with on
/// `idempotency`.
pub fn openapi(idempotency: &Idempotency) -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    PublishedPolicy::new(idempotency)
        .operation(http::Method::POST, "/deposits", DEPOSIT_POLICY)
        .apply(&mut doc)
        .expect("every protected operation is in ApiDoc");
    doc
}

/// `POST /deposits`: one ledger row, committed with the stored response.
///
/// A validation `400` is an `Ok` answer, so it is committed and replayed like a `201`; an
/// `Err` (here a database error) rolls the row back and releases the key.
// `#[idempotent]` may come before or after `#[utoipa::path]` (the payments demo has it
// after): either way utoipa documents the operation and the macro wraps the handler.
#[idempotent(scope = caller, policy = DEPOSIT_POLICY)]
#[utoipa::path(
    post,
    path = "/deposits",
    summary = "Deposit",
    description = "Credits the caller once per idempotency key; the entry and the stored \
                   response commit together.",
    request_body = DepositRequest,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Deposited", body = Entry,
            headers(("Location" = String, description = "The new entry"))),
        (status = 400, description = "Invalid amount (`invalid_request`; recorded and \
            replayed), or a body that is not JSON (`bad_request`, from the JSON extractor: \
            nothing ran, the key stays unused).",
            body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No `Authorization: Bearer` header with a demo API key \
            (`unauthenticated`).",
            body = Problem, content_type = "application/problem+json",
            headers(("WWW-Authenticate" = String, description = "`Bearer`"))),
        (status = 415, description = "The body is not sent as JSON: `Content-Type` missing or \
            not `application/json` (`unsupported_media_type`, from the JSON extractor: nothing \
            ran, the key stays unused).",
            body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Two answers, told apart by `code`. The body is JSON but \
            not a `DepositRequest` object, e.g. an array or a number (`unprocessable_entity`, \
            from the JSON extractor: nothing ran, the key stays unused).",
            body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database is unavailable for a moment, e.g. \
            restarting (`database_unavailable`): nothing was written; retry with the same key.",
            body = Problem, content_type = "application/problem+json"),
    )
)]
async fn deposit(
    caller: Caller,
    tx: &mut Tx<Sqlite>,
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

/// `GET /balance`: the caller's balance and number of entries.
#[utoipa::path(
    get,
    path = "/balance",
    summary = "The caller's balance",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Balance and number of entries", body = Balance),
        (status = 401, description = "No `Authorization: Bearer` header with a demo API key \
            (`unauthenticated`).",
            body = Problem, content_type = "application/problem+json",
            headers(("WWW-Authenticate" = String, description = "`Bearer`"))),
    )
)]
async fn balance(
    caller: Caller,
    State(db): State<SqlitePool>,
) -> Result<Json<Balance>, LedgerError> {
    let (balance, entries) = sqlx::query_as(BALANCE)
        .bind(caller.account())
        .fetch_one(&db)
        .await?;
    Ok(Json(Balance { balance, entries }))
}

/// The ledger's table (`$N` placeholders below work on SQLite and Postgres alike).
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS demo_ledger (
    id TEXT PRIMARY KEY,
    account TEXT NOT NULL,
    amount BIGINT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS demo_ledger_account ON demo_ledger (account);
";

/// Inserts one entry: id, account, amount, created at (ms).
pub const INSERT_ENTRY: &str =
    "INSERT INTO demo_ledger (id, account, amount, created_at) VALUES ($1, $2, $3, $4)";

/// The balance and number of entries of one account.
pub const BALANCE: &str = "SELECT CAST(COALESCE(SUM(amount), 0) AS BIGINT) AS balance, \
     COUNT(*) AS entries FROM demo_ledger WHERE account = $1";

/// The largest deposit, in minor units. A balance is the sum of its entries as a
/// `BIGINT`; uncapped deposits near `i64::MAX` made `GET /balance` overflow after two, where
/// this cap leaves room for millions.
pub const MAX_DEPOSIT: i64 = 1_000_000_000_000;

/// The body of `POST /deposits`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct DepositRequest {
    /// Minor units: a whole number from 1 to [`MAX_DEPOSIT`].
    // Any JSON value, so that a bad amount is the handler's `400` (recorded and replayed),
    // not the extractor's `422`; the schema states what the handler accepts.
    #[serde(default)]
    #[schema(value_type = i64, required = true, minimum = 1, maximum = 1_000_000_000_000_i64, example = 500)]
    pub amount: serde_json::Value,
}

/// A ledger entry.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Entry {
    /// `dep_…`
    pub id: String,
    /// The account credited.
    pub account: String,
    /// Minor units.
    pub amount: i64,
}

impl Entry {
    /// The entry `request` asks for; `Err` is the `400` to answer.
    pub fn new(caller: &Caller, request: &DepositRequest) -> Result<Self, LedgerError> {
        let amount = amount::minor_units(&request.amount)
            .filter(|amount| *amount <= MAX_DEPOSIT)
            .ok_or_else(|| {
                LedgerError::Invalid(format!(
                    "Amount must be a whole number of minor units from 1 to {MAX_DEPOSIT}, e.g. 500."
                ))
            })?;
        Ok(Self {
            id: format!("dep_{:016x}", rand::random::<u64>()),
            account: caller.account().to_owned(),
            amount,
        })
    }

    /// `201 Created` with the entry.
    pub fn created(self) -> Response {
        let location =
            HeaderValue::try_from(format!("/deposits/{}", self.id)).expect("ids are header-safe");
        (
            StatusCode::CREATED,
            [(header::LOCATION, location)],
            Json(self),
        )
            .into_response()
    }
}

/// `{"balance": n, "entries": k}`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Balance {
    /// Sum of the caller's entries.
    pub balance: i64,
    /// Number of the caller's entries.
    pub entries: i64,
}

/// The ledger's errors, as problem+json.
#[derive(Debug)]
pub enum LedgerError {
    /// A deposit that does not validate (`400`).
    Invalid(String),
    /// The database failed: `503` + `Retry-After` for an outage a retry outlives (a lost
    /// connection, a restart; [`is_transient`](crate::database::is_transient)), else `500`.
    /// Either way the deposit rolled back and its key is released.
    Database(sqlx::Error),
}

impl From<sqlx::Error> for LedgerError {
    fn from(err: sqlx::Error) -> Self {
        LedgerError::Database(err)
    }
}

impl IntoResponse for LedgerError {
    fn into_response(self) -> Response {
        match self {
            LedgerError::Invalid(detail) => Problem::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "Invalid request",
                detail,
            ),
            LedgerError::Database(err) if crate::database::is_transient(&err) => {
                tracing::warn!(%err, "ledger database unavailable; answering 503");
                Problem::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "database_unavailable",
                    "Database unavailable",
                    "Nothing was written. Retry with the same key.",
                )
                .with_retry_after(1)
            }
            LedgerError::Database(err) => {
                tracing::error!(%err, "ledger database error");
                Problem::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal_error",
                    "Internal error",
                    "Something went wrong. It is safe to retry with the same key.",
                )
            }
        }
        .into_response()
    }
}

/// The environment variable that makes the demo abort between a write and its commit.
pub const CRASH_AFTER_WRITE_ENV: &str = "LEDGER_CRASH_AFTER_WRITE";

/// Aborts the process when [`CRASH_AFTER_WRITE_ENV`] is `1`.
pub fn crash_if_asked() {
    static CRASH: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *CRASH.get_or_init(|| std::env::var(CRASH_AFTER_WRITE_ENV).is_ok_and(|v| v == "1")) {
        eprintln!(
            "ledger demo: aborting after the write, before the commit ({CRASH_AFTER_WRITE_ENV}=1)"
        );
        std::process::abort();
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// What the startup banner suggests.
pub const BANNER: Banner = Banner {
    name: "ledger",
    post: "/deposits",
    body: r#"{"amount": 500}"#,
    get: "/balance",
};

/// Opens the SQLite file, creates the ledger table, wires the engine and serves until
/// Ctrl-C.
pub async fn run(args: DemoArgs) -> Result<(), BoxError> {
    if !args.database_url.starts_with("sqlite:") {
        return Err(format!(
            "the ledger example runs on SQLite: pass --database-url sqlite://ledger.db \
             (the URL came from {})",
            args.database_url_from
        )
        .into());
    }
    // One pool for the store and the ledger: the transaction covers both.
    let store = SqliteStore::connect(&args.database_url).await?;
    let db = store.pool().clone();
    sqlx::raw_sql(SCHEMA).execute(&db).await?;
    let idempotency = Idempotency::builder(store)
        .default_lease(args.lease)
        .default_ttl(args.ttl)
        .default_wait(args.wait.unwrap_or_default())
        .build();
    let _sweeper = idempotency.spawn_sweeper(Duration::from_secs(60));
    let app = router(AppState {
        idempotency: idempotency.clone(),
        db,
    });
    serve::serve(app, &idempotency, &args, BANNER).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_and_retry_after(error: LedgerError) -> (StatusCode, bool) {
        let response = error.into_response();
        let retry_after = response.headers().contains_key(header::RETRY_AFTER);
        (response.status(), retry_after)
    }

    /// A deposit cut off by a database restart is rolled back and its key released; the
    /// answer says to retry (`503` + `Retry-After`), which a retrying client does.
    #[test]
    fn a_lost_database_connection_is_a_503_with_retry_after() {
        let lost = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert_eq!(
            status_and_retry_after(LedgerError::from(lost)),
            (StatusCode::SERVICE_UNAVAILABLE, true)
        );
        assert_eq!(
            status_and_retry_after(LedgerError::from(sqlx::Error::RowNotFound)),
            (StatusCode::INTERNAL_SERVER_ERROR, false)
        );
    }
}
