//! The payments demo app, served by `cargo run --example payments` and the `payments-demo`
//! binary (see `-- --help` for the flags).
//!
//! - `POST /payments` `{"amount": 10000, "currency": "BRL"}` — requires `Idempotency-Key`;
//!   charges the (fake) payment gateway once per key and answers `201` with `Location`;
//! - `GET /payments` — the caller's charges as the gateway recorded them;
//! - `GET /payments/{id}` — one of them;
//! - `GET /metrics` — the engine's counters and latencies in the Prometheus text format
//!   (added by the serve loop, [`crate::prometheus`]).
//! - `POST /webhooks/gateway` — events the gateway posts, signed the Standard Webhooks way
//!   (`--webhook-secret`): verified, then handled once per event id however often the
//!   gateway delivers it (a `charge.refunded` mails the customer one refund notice);
//! - `GET /openapi.json` — the API in OpenAPI 3.1, `POST /payments` with its published
//!   idempotency policy (key header, problem answers, TTL and lease as configured).
//!
//! With `--consume-nats` or `--consume-rabbitmq` it also consumes charge commands from a
//! queue, once per command id ([`crate::consumer`]).
//!
//! `POST /payments` runs three steps, each a recovery point: a later execution of the same
//! request (a retry after a crash, once the lease has run out) gets each recorded output
//! back instead of running the step again:
//!
//! 1. `authorise`: the gateway charges the card (an external effect, deduplicated by the
//!    gateway too through `key.derive("authorise")`). The call goes over HTTP through
//!    `idempotent-client`, which sends that key on every retry of a lost answer. The step
//!    is at most once: a call whose answer was never recorded is looked up at the gateway
//!    by that key instead of being made again, so even a gateway that ignores keys
//!    (`--gateway-keys ignore`) charges once;
//! 2. `ledger`: one row in `demo_payment_ledger`. With an SQL store the row is written in
//!    the store's own database and commits together with the step's record (exactly
//!    once); with Redis it goes to the gateway's database as a plain step;
//! 3. `receipt`: the (fake) mailer mails a receipt, which it would do again if asked.
//!
//! What a user of `idempotent` writes is all here: the `#[idempotent]` handler and its
//! steps, the router state with the engine in it (`FromRef`), the engine wiring and the
//! router. The plumbing (bearer auth, flags, the fake gateway and mailer, the serve loop)
//! is in the other modules of this library.

use std::time::Duration;

use axum::extract::{FromRef, Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::{HeaderValue, StatusCode, header};
use idempotent_runtime::openapi::PublishedPolicy;
use idempotent_runtime::rejection::AsProblem;
use idempotent_runtime::steps::Verified;
use idempotent_runtime::transaction::{Tx, TxDatabase};
use idempotent_runtime::webhook::WebhookVerifier;
use idempotent_runtime::{
    Idempotency, IdempotencyKey, IdempotencyLayer, Problem, StepError, idempotent,
};
use serde::{Deserialize, Serialize};
use utoipa::OpenApi;

use crate::amount;
use crate::auth::{BearerAuth, Caller};
use crate::cli::DemoArgs;
use crate::database::{self, Database};
use crate::gateway::api::GatewayClient;
use crate::gateway::{Charge, EffectsLog, Gateway, GatewayError};
use crate::mailer::Mailer;
use crate::serve::{self, Banner, BoxError};

/// The router state: the idempotency engine, the fake providers and the payments ledger.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The idempotency engine (`#[idempotent]` handlers find it through `FromRef`).
    pub idempotency: Idempotency,
    /// The payment provider's records (`GET /payments` reads them).
    pub gateway: Gateway,
    /// The payment provider's API, which `POST /payments` charges through.
    pub gateway_client: GatewayClient,
    /// The receipt mailer.
    pub mailer: Mailer,
    /// Where each payment's ledger row goes.
    pub ledger: Ledger,
    /// The test hook that stops a request after a step (`--pause-after-step`).
    pub pause: PauseAfterStep,
    /// Verifies the events the gateway posts to `POST /webhooks/gateway`.
    pub webhooks: WebhookVerifier,
    /// How the `authorise` step guards the gateway call (`--authorise`).
    pub authorise: Authorise,
}

/// How `POST /payments` runs its `authorise` step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Authorise {
    /// At most once (`key.step_at_most_once`): a call whose answer was not recorded is
    /// looked up at the gateway by its derived key instead of being made again.
    #[default]
    AtMostOnce,
    /// At least once (`key.step`): such a call is made again, and only a gateway that
    /// honours idempotency keys keeps it from charging twice. For comparison.
    AtLeastOnce,
}

/// The demo's published webhook secret: what `--webhook-secret` defaults to, and what the
/// tests sign events with.
pub const DEMO_WEBHOOK_SECRET: &str = "whsec_ZGVtby13ZWJob29rLXNlY3JldC1kby1ub3QtdXNl";

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.idempotency.clone()
    }
}

impl FromRef<AppState> for Gateway {
    fn from_ref(state: &AppState) -> Self {
        state.gateway.clone()
    }
}

/// The payments API.
pub fn router(state: AppState) -> Router {
    let doc = Json(openapi(&state.idempotency));
    // Verified before anything else, then one run per event id: a redelivery replays.
    let webhooks = Router::new()
        .route("/webhooks/gateway", post(gateway_event))
        .route_layer(
            IdempotencyLayer::new(state.idempotency.clone())
                .standard_webhooks("gateway", state.webhooks.clone())
                .name("gateway_webhook"),
        );
    Router::new()
        .route("/payments", post(create_payment).get(list_payments))
        .route("/payments/{id}", get(get_payment))
        .route("/openapi.json", get(move || async move { doc }))
        .merge(webhooks)
        .with_state(state)
}

/// An event the gateway posts.
#[derive(Debug, Deserialize)]
pub struct GatewayEvent {
    /// What happened, e.g. `charge.refunded`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The charge it happened to.
    pub data: ChargeEvent,
}

/// The charge an event is about.
#[derive(Debug, Deserialize)]
pub struct ChargeEvent {
    /// The gateway's charge id.
    pub charge: String,
    /// The account the charge belongs to.
    pub account: String,
}

/// `POST /webhooks/gateway`: a `charge.refunded` event mails the customer a refund notice;
/// other events are acknowledged and ignored (a sender stops retrying on a `2xx`). The
/// layer in front runs it once per event id, so the customer gets one notice however often
/// the gateway delivers the event.
async fn gateway_event(
    State(state): State<AppState>,
    AsProblem(Json(event)): AsProblem<Json<GatewayEvent>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    if event.kind != "charge.refunded" {
        return Ok(Json(serde_json::json!({ "ignored": event.kind })));
    }
    let notice = state
        .mailer
        .send_refund_notice(&event.data.account, &event.data.charge)
        .await
        .map_err(|err| ApiError::Internal(err.to_string()))?;
    Ok(Json(serde_json::json!({ "notice": notice.id })))
}

/// The operations, as `#[utoipa::path]` describes them.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Payments demo",
        description = "Charges a (fake) payment gateway once per idempotency key."
    ),
    paths(create_payment, list_payments, get_payment),
    modifiers(&BearerAuth)
)]
struct ApiDoc;

/// The OpenAPI document, with the idempotency policy `POST /payments` runs with on
/// `idempotency` (the handler's `policy = CREATE_PAYMENT_POLICY`, the engine's TTL and
/// lease).
pub fn openapi(idempotency: &Idempotency) -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    PublishedPolicy::new(idempotency)
        .operation(http::Method::POST, "/payments", CREATE_PAYMENT_POLICY)
        .apply(&mut doc)
        .expect("every protected operation is in ApiDoc");
    doc
}

/// `POST /payments`: charges the gateway once per idempotency key and caller, then writes
/// the ledger row and mails the receipt, each step once.
///
/// `scope = caller`: keys are unique per authenticated account. `key` is the claimed key
/// and runs the steps; `key.derive("authorise")` is the gateway's own idempotency key, the
/// same on every retry of this request and on every attempt of the gateway call, so the
/// provider deduplicates too. `AsProblem`
/// answers malformed JSON as problem+json, before the key is claimed.
#[utoipa::path(
    post,
    path = "/payments",
    summary = "Charge a card",
    description = "Charges the gateway once per idempotency key and caller.",
    request_body = ChargeRequest,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Charged", body = Payment,
            headers(("Location" = String, description = "The new payment"))),
        (status = 400, description = "Invalid amount or currency (`invalid_request`; \
            recorded and replayed), or a body that is not JSON (`bad_request`, from the JSON \
            extractor: nothing ran, the key stays unused).",
            body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No `Authorization: Bearer` header with a demo API key \
            (`unauthenticated`).",
            body = Problem, content_type = "application/problem+json",
            headers(("WWW-Authenticate" = String, description = "`Bearer`"))),
        (status = 402, description = "The card was declined (`card_declined`).",
            body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not sent as JSON: `Content-Type` missing or \
            not `application/json` (`unsupported_media_type`, from the JSON extractor: nothing \
            ran, the key stays unused).",
            body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Two answers, told apart by `code`. The body is JSON but \
            not a `ChargeRequest` object, e.g. an array or a number (`unprocessable_entity`, \
            from the JSON extractor: nothing ran, the key stays unused).",
            body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The gateway is down (`gateway_unavailable`; nothing was \
            charged) or did not answer (`gateway_unreachable`; a retry with the same key charges \
            at most once). Or the demo's database is unavailable for a moment, e.g. restarting \
            (`database_unavailable`): retry with the same key, the steps already done are not \
            repeated.",
            body = Problem, content_type = "application/problem+json"),
    )
)]
#[idempotent(scope = caller, policy = CREATE_PAYMENT_POLICY)]
async fn create_payment(
    caller: Caller,
    key: IdempotencyKey,
    State(state): State<AppState>,
    AsProblem(Json(request)): AsProblem<Json<ChargeRequest>>,
) -> Result<impl IntoResponse, ApiError> {
    let (amount, currency) = request.validate()?;
    let account = caller.account();

    // A resumed request gets the recorded charge back and does not call the gateway again.
    // A call whose answer was never recorded (a crash, the store away) is not repeated
    // blindly: the gateway is asked for a charge under the derived key first, which is
    // all a provider without idempotency keys offers.
    let downstream_key = key.derive("authorise");
    let call = || async {
        let charged = state
            .gateway_client
            .charge(account, amount, &currency, &downstream_key)
            .await;
        state.pause.after("authorise-call").await;
        match charged {
            // A declined card is the call's outcome too: recorded like a charge.
            Ok(charge) | Err(GatewayError::Declined(charge)) => Ok::<_, ApiError>(charge),
            Err(error) => Err(error.into()),
        }
    };
    let charge: Charge = match state.authorise {
        Authorise::AtMostOnce => {
            let verify = || async {
                Ok(match state.gateway_client.find(&downstream_key).await? {
                    Some(charge) => Verified::Happened(charge),
                    None => Verified::NotHappened,
                })
            };
            key.step_at_most_once("authorise", call, verify).await?
        }
        Authorise::AtLeastOnce => key.step("authorise", call).await?,
    };
    state.pause.after("authorise").await;
    if charge.status == "declined" {
        return Err(ApiError::Declined(charge.into()));
    }

    // The row's id is recorded as the step's output; a resumed request writes no row.
    let entry = LedgerEntry::new(account, &charge);
    let _entry_id: String = match &state.ledger {
        Ledger::Atomic(db) => write_atomically(&key, db, &entry).await?,
        Ledger::Separate(db) => {
            key.step("ledger", || async {
                Ok::<_, ApiError>(entry.insert_on(db).await?)
            })
            .await?
        }
    };
    state.pause.after("ledger").await;

    // The mailer has no idempotency key: only the step keeps a retry from mailing twice.
    let _receipt = key
        .step("receipt", || async {
            state
                .mailer
                .send_receipt(account, &charge.id)
                .await
                .map_err(|err| ApiError::Internal(err.to_string()))
        })
        .await?;
    state.pause.after("receipt").await;

    let payment = Payment::from(charge);
    let location = HeaderValue::try_from(format!("/payments/{}", payment.id))
        .map_err(|err| ApiError::Internal(err.to_string()))?;
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(payment),
    ))
}

/// The `ledger` step as an atomic step on the store's own database: the row and the step's
/// record commit in one transaction.
async fn write_atomically(
    key: &IdempotencyKey,
    db: &Database,
    entry: &LedgerEntry,
) -> Result<String, StepError<ApiError>> {
    let insert = db.dialect(INSERT_LEDGER_ROW);
    match db {
        Database::Sqlite(_) => {
            atomic_ledger_step::<idempotent_runtime::Sqlite>(key, &insert, entry).await
        }
        #[cfg(feature = "postgres")]
        Database::Postgres(_) => {
            atomic_ledger_step::<idempotent_runtime::Postgres>(key, &insert, entry).await
        }
        #[cfg(feature = "mysql")]
        Database::MySql(_) => {
            atomic_ledger_step::<idempotent_runtime::MySql>(key, &insert, entry).await
        }
    }
}

/// `atomic_step("ledger", …)` inserting `entry` with `insert` (in `DB`'s dialect).
async fn atomic_ledger_step<DB>(
    key: &IdempotencyKey,
    insert: &str,
    entry: &LedgerEntry,
) -> Result<String, StepError<ApiError>>
where
    DB: TxDatabase,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    key.atomic_step("ledger", async |tx: &mut Tx<DB>| {
        sqlx::query::<DB>(sqlx::AssertSqlSafe(insert.to_owned()))
            .bind(entry.id.clone())
            .bind(entry.payment.clone())
            .bind(entry.account.clone())
            .bind(entry.amount)
            .bind(entry.currency.clone())
            .bind(entry.created_at)
            .execute(tx.conn())
            .await
            .map_err(ApiError::from)?;
        Ok(entry.id.clone())
    })
    .await
}

/// `GET /payments`: the caller's charges. Reads need no idempotency key.
#[utoipa::path(
    get,
    path = "/payments",
    summary = "List the caller's payments",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The caller's payments", body = Vec<Payment>),
        (status = 401, description = "No `Authorization: Bearer` header with a demo API key \
            (`unauthenticated`).",
            body = Problem, content_type = "application/problem+json",
            headers(("WWW-Authenticate" = String, description = "`Bearer`"))),
    )
)]
async fn list_payments(
    caller: Caller,
    State(gateway): State<Gateway>,
) -> Result<Json<Vec<Payment>>, ApiError> {
    let charges = gateway.list(caller.account()).await?;
    Ok(Json(charges.into_iter().map(Payment::from).collect()))
}

/// `GET /payments/{id}`: one of the caller's charges.
#[utoipa::path(
    get,
    path = "/payments/{id}",
    summary = "One payment",
    params(("id" = String, Path, description = "`pay_…`")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The payment", body = Payment),
        (status = 401, description = "No `Authorization: Bearer` header with a demo API key \
            (`unauthenticated`).",
            body = Problem, content_type = "application/problem+json",
            headers(("WWW-Authenticate" = String, description = "`Bearer`"))),
        (status = 404, description = "No such payment for this caller (`not_found`).",
            body = Problem, content_type = "application/problem+json"),
    )
)]
async fn get_payment(
    caller: Caller,
    State(gateway): State<Gateway>,
    Path(id): Path<String>,
) -> Result<Json<Payment>, ApiError> {
    let charge = gateway
        .get(caller.account(), &id)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(Json(charge.into()))
}

/// The body of `POST /payments`.
// The fields are any JSON value and validated in the handler, so a `400` for a bad amount
// is stored and replayed like any other answer; malformed JSON is refused by the extractor
// before the key is claimed. The schema states exactly what `validate` accepts.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
struct ChargeRequest {
    /// Minor units: a whole number from 1.
    #[serde(default)]
    #[schema(value_type = i64, required = true, minimum = 1, maximum = 9_223_372_036_854_775_807_i64, example = 10000)]
    amount: serde_json::Value,
    /// Three upper-case ASCII letters (ISO 4217).
    #[serde(default)]
    #[schema(value_type = String, required = true, pattern = "^[A-Z]{3}$", min_length = 3, max_length = 3, example = "BRL")]
    currency: serde_json::Value,
}

impl ChargeRequest {
    fn validate(&self) -> Result<(i64, String), ApiError> {
        let amount = amount::minor_units(&self.amount).ok_or_else(|| {
            ApiError::Invalid(
                "Amount must be a positive integer in minor units, e.g. 10000.".into(),
            )
        })?;
        match self.currency.as_str() {
            Some(currency)
                if currency.len() == 3 && currency.bytes().all(|b| b.is_ascii_uppercase()) =>
            {
                Ok((amount, currency.to_owned()))
            }
            _ => Err(ApiError::Invalid(
                "Currency must be three upper-case letters, e.g. \"BRL\".".into(),
            )),
        }
    }
}

/// A payment as the API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
struct Payment {
    /// `pay_…`
    id: String,
    /// Minor units.
    amount: i64,
    /// ISO 4217 code.
    currency: String,
    /// `succeeded` or `declined`.
    status: String,
}

impl From<Charge> for Payment {
    fn from(charge: Charge) -> Self {
        Self {
            id: charge.id,
            amount: charge.amount,
            currency: charge.currency,
            status: charge.status,
        }
    }
}

/// Where the `ledger` step writes each payment's row (`demo_payment_ledger`).
#[derive(Debug, Clone)]
pub enum Ledger {
    /// In the idempotency store's own database (an SQL store): an atomic step, so the row
    /// and the step's record commit together.
    Atomic(Database),
    /// In another database than the store's (a Redis store keeps only records): a plain
    /// step, so a crash between the row's commit and the step's record writes it again on
    /// the retry.
    Separate(Database),
}

impl Ledger {
    /// The ledger in `db` (its table created if missing): [`Atomic`](Self::Atomic) when
    /// `db` is also where the store keeps its records.
    pub async fn new(db: Database, shared_with_store: bool) -> Result<Self, sqlx::Error> {
        let schema = match &db {
            #[cfg(feature = "mysql")]
            Database::MySql(_) => LEDGER_SCHEMA_MYSQL,
            _ => LEDGER_SCHEMA,
        };
        db.execute_script(schema).await?;
        Ok(if shared_with_store {
            Ledger::Atomic(db)
        } else {
            Ledger::Separate(db)
        })
    }

    /// The database the ledger's rows are in.
    pub fn database(&self) -> &Database {
        match self {
            Ledger::Atomic(db) | Ledger::Separate(db) => db,
        }
    }
}

/// The payments ledger. No unique constraint on `payment_id`, on purpose: the `ledger`
/// step alone keeps a payment to one row, and the crash tests count them.
const LEDGER_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS demo_payment_ledger (
    id TEXT PRIMARY KEY,
    payment_id TEXT NOT NULL,
    account TEXT NOT NULL,
    amount BIGINT NOT NULL,
    currency TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS demo_payment_ledger_payment ON demo_payment_ledger (payment_id)
";

/// [`LEDGER_SCHEMA`] for MySQL, which indexes no `TEXT` without a length.
#[cfg(feature = "mysql")]
const LEDGER_SCHEMA_MYSQL: &str = "
CREATE TABLE IF NOT EXISTS demo_payment_ledger (
    id VARCHAR(64) PRIMARY KEY,
    payment_id VARCHAR(64) NOT NULL,
    account VARCHAR(255) NOT NULL,
    amount BIGINT NOT NULL,
    currency VARCHAR(16) NOT NULL,
    created_at BIGINT NOT NULL,
    INDEX demo_payment_ledger_payment (payment_id)
)
";

/// Inserts one ledger row (`$N` placeholders: pass it through [`Database::dialect`]).
const INSERT_LEDGER_ROW: &str = "INSERT INTO demo_payment_ledger \
    (id, payment_id, account, amount, currency, created_at) VALUES ($1, $2, $3, $4, $5, $6)";

/// One row of the payments ledger.
#[derive(Debug, Clone)]
struct LedgerEntry {
    /// `led_…`, new for every row written.
    id: String,
    payment: String,
    account: String,
    amount: i64,
    currency: String,
    created_at: i64,
}

impl LedgerEntry {
    fn new(account: &str, charge: &Charge) -> Self {
        Self {
            id: format!("led_{:016x}", rand::random::<u64>()),
            payment: charge.id.clone(),
            account: account.to_owned(),
            amount: charge.amount,
            currency: charge.currency.clone(),
            created_at: crate::ledger::now_millis(),
        }
    }

    /// Inserts the row on `db`'s pool (its own transaction); answers its id.
    async fn insert_on(&self, db: &Database) -> Result<String, sqlx::Error> {
        let insert = db.dialect(INSERT_LEDGER_ROW);
        crate::on_pool!(db, |pool| sqlx::query(sqlx::AssertSqlSafe(insert.as_str()))
            .bind(&self.id)
            .bind(&self.payment)
            .bind(&self.account)
            .bind(self.amount)
            .bind(&self.currency)
            .bind(self.created_at)
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))?;
        Ok(self.id.clone())
    }
}

/// The test hook `--pause-after-step` (`PAYMENTS_DEMO_PAUSE_AFTER_STEP`): stops every
/// `POST /payments` for good once the named step is recorded. Off unless asked for.
#[derive(Debug, Clone, Default)]
pub struct PauseAfterStep {
    step: Option<std::sync::Arc<str>>,
}

impl PauseAfterStep {
    /// Pauses after `step`, or never for `None`.
    pub fn new(step: Option<&str>) -> Self {
        Self {
            step: step.map(Into::into),
        }
    }

    /// Prints `paused after step STEP` to stderr and never completes when `step` is the
    /// one to pause after; completes at once otherwise.
    pub(crate) async fn after(&self, step: &str) {
        if self.step.as_deref() == Some(step) {
            eprintln!("{PAUSE_LINE} {step} (PAYMENTS_DEMO_PAUSE_AFTER_STEP): waiting to be killed");
            std::future::pending::<()>().await;
        }
    }
}

/// How the line the pause hook prints starts (followed by the step's name).
pub const PAUSE_LINE: &str = "payments-demo: paused after step";

/// The API's errors, answered as problem+json like the library's own.
#[derive(Debug)]
enum ApiError {
    /// A request that does not validate (`400`).
    Invalid(String),
    /// The card was declined (`402`); the payment is recorded as declined.
    Declined(Payment),
    /// The gateway is down (`503`); nothing happened, retry with the same key.
    GatewayUnavailable,
    /// The gateway did not answer (`503`); a retry with the same key charges at most once.
    GatewayUnreachable,
    /// No such payment for this caller (`404`).
    NotFound,
    /// The demo's database is unavailable for a moment: the connection was lost or
    /// refused, e.g. during a restart (`503` + `Retry-After`; the claim is released and
    /// the steps done so far are kept, so a retry resumes after them).
    DatabaseUnavailable,
    /// The demo's database failed otherwise (`500`).
    Internal(String),
    /// A step could not run or be recorded (the lease was lost, the store failed): the
    /// engine's answer for it, a problem+json `5xx`.
    Step(Box<Response>),
}

impl From<StepError<ApiError>> for ApiError {
    fn from(err: StepError<ApiError>) -> Self {
        match err {
            StepError::Failed(err) => err,
            other => ApiError::Step(Box::new(other.into_response())),
        }
    }
}

impl From<GatewayError> for ApiError {
    fn from(err: GatewayError) -> Self {
        match err {
            GatewayError::Declined(charge) => ApiError::Declined(charge.into()),
            GatewayError::Unavailable => ApiError::GatewayUnavailable,
            GatewayError::Unreachable(err) => {
                tracing::warn!(%err, "the gateway did not answer");
                ApiError::GatewayUnreachable
            }
            GatewayError::Ledger(err) => err.into(),
            GatewayError::EffectsLog(err) => ApiError::Internal(err.to_string()),
            GatewayError::Protocol(detail) => ApiError::Internal(detail),
        }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(err: sqlx::Error) -> Self {
        if database::is_transient(&err) {
            tracing::warn!(error = %err, "database unavailable; answering 503");
            ApiError::DatabaseUnavailable
        } else {
            ApiError::Internal(err.to_string())
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let problem = match self {
            ApiError::Invalid(detail) => Problem::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "Invalid request",
                detail,
            ),
            ApiError::Declined(payment) => Problem::new(
                StatusCode::PAYMENT_REQUIRED,
                "card_declined",
                "Card declined",
                format!(
                    "The card was declined; payment {} is recorded as declined.",
                    payment.id
                ),
            )
            // A machine code, like the library's reasons; the payment id is in `detail`
            // and in `GET /payments`.
            .with_reason("generic_decline"),
            ApiError::GatewayUnavailable => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "gateway_unavailable",
                "Payment gateway unavailable",
                "Nothing was charged. Retry with the same Idempotency-Key.",
            )
            .with_retry_after(1),
            ApiError::DatabaseUnavailable => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "database_unavailable",
                "Database unavailable",
                "The payment could not be completed just now. Retry with the same \
                 Idempotency-Key: what was already done is not done again.",
            )
            .with_retry_after(1),
            ApiError::GatewayUnreachable => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "gateway_unreachable",
                "Payment gateway unreachable",
                "The gateway did not answer. Retry with the same Idempotency-Key: the card is \
                 charged at most once.",
            )
            .with_retry_after(1),
            ApiError::NotFound => Problem::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "Not found",
                "No such payment for this account.",
            ),
            ApiError::Step(response) => return *response,
            ApiError::Internal(detail) => {
                tracing::error!(%detail, "internal error");
                Problem::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal_error",
                    "Internal error",
                    "Something went wrong.",
                )
            }
        };
        problem.into_response()
    }
}

/// Opens the database, wires the engine and serves until Ctrl-C.
pub async fn run(args: DemoArgs) -> Result<(), BoxError> {
    // The store by URL scheme: SQLite for `sqlite://…` (the default), Postgres for
    // `postgres://…`, MySQL/MariaDB for `mysql://…` — the gateway keeps its charges in
    // the same database — or Redis for `redis://…`, with the gateway's charges in
    // `--gateway-database-url` (an SQLite file by default).
    if database::is_key_value_store(&args.database_url) {
        tracing::info!(
            gateway_database = %database::redact_url(&args.gateway_database_url),
            "the store keeps only idempotency records; the gateway's charges go here"
        );
    }
    database::wait_until_reachable(&args.database_url, args.database_wait).await?;
    if database::is_key_value_store(&args.database_url) {
        database::wait_until_reachable(&args.gateway_database_url, args.database_wait).await?;
    }
    let (db, store) = database::open_store(&args.database_url, &args.gateway_database_url).await?;
    let effects = EffectsLog::open(args.effects_log.as_deref())?;
    let idempotency = Idempotency::builder_shared(store)
        .default_lease(args.lease)
        .default_ttl(args.ttl)
        .default_wait(args.wait.unwrap_or_default())
        .build();
    // Purges expired keys every minute, in the background.
    let _sweeper = idempotency.spawn_sweeper(Duration::from_secs(60));
    let gateway = Gateway::new(db.clone(), args.gateway_latency())
        .await?
        .with_keys(args.gateway_keys)
        .with_effects_log(effects.clone());
    // The fake provider listens on loopback; the handler calls it like a real one.
    let gateway_addr =
        crate::gateway::api::serve(gateway.clone(), ([127, 0, 0, 1], 0).into()).await?;
    tracing::info!(%gateway_addr, "the fake payment gateway listens");
    let gateway_client = GatewayClient::new(gateway_addr);
    // Charge commands from NATS or RabbitMQ, when asked for: the same gateway and database.
    crate::consumer::start(&args, &idempotency, &gateway_client, &db).await?;
    let ledger = Ledger::new(db, !database::is_key_value_store(&args.database_url)).await?;
    if let Some(step) = &args.pause_after_step {
        tracing::warn!(%step, "test hook: every POST /payments stops after this step");
    }
    let app = router(AppState {
        idempotency: idempotency.clone(),
        gateway,
        gateway_client,
        mailer: Mailer::new(effects),
        ledger,
        pause: PauseAfterStep::new(args.pause_after_step.as_deref()),
        webhooks: WebhookVerifier::new([&args.webhook_secret])?,
        authorise: args.authorise,
    });
    let banner = Banner {
        name: "payments",
        post: "/payments",
        body: r#"{"amount": 10000, "currency": "BRL"}"#,
        get: "/payments",
    };
    serve::serve(app, &idempotency, &args, banner).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The status, `Retry-After` and problem code of `error`'s answer.
    async fn answer(error: ApiError) -> (StatusCode, Option<String>, String) {
        let response = error.into_response();
        let (status, headers) = (response.status(), response.headers().clone());
        let retry_after = headers
            .get(header::RETRY_AFTER)
            .map(|value| value.to_str().unwrap().to_owned());
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        (
            status,
            retry_after,
            problem["code"].as_str().unwrap().to_owned(),
        )
    }

    fn connection_lost() -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
    }

    /// A database restart mid-request is an outage a retry outlives, not a bug: `503` with
    /// `Retry-After`, so a retrying client comes back with the same key.
    #[tokio::test]
    async fn a_lost_database_connection_is_a_503_with_retry_after() {
        for error in [
            ApiError::from(connection_lost()),
            ApiError::from(sqlx::Error::PoolTimedOut),
            ApiError::from(GatewayError::Ledger(connection_lost())),
        ] {
            let (status, retry_after, code) = answer(error).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
            assert!(retry_after.is_some(), "a 503 says when to retry");
            assert_eq!(code, "database_unavailable");
        }
    }

    #[tokio::test]
    async fn other_database_errors_stay_a_500() {
        let (status, retry_after, code) = answer(ApiError::from(sqlx::Error::RowNotFound)).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(retry_after, None);
        assert_eq!(code, "internal_error");
    }
}
