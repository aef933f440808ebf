//! The payments demo API (DESIGN §7):
//!
//! - `POST /payments` `{"amount": 10000, "currency": "BRL"}` — requires `Idempotency-Key`;
//!   charges the fake gateway once per key and answers `201` with `Location`;
//! - `GET /payments` — the caller's charges as the gateway recorded them;
//! - `GET /payments/{id}` — one of them.

use axum::extract::{FromRef, Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::{HeaderValue, StatusCode, header};
use idempotent_runtime::{Idempotency, IdempotencyKey, Problem, idempotent};
use serde::{Deserialize, Serialize};

use crate::auth::Caller;
use crate::gateway::{Charge, Gateway, GatewayError};

/// The router state: the idempotency engine and the gateway.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The idempotency engine.
    pub idempotency: Idempotency,
    /// The fake payment gateway.
    pub gateway: Gateway,
}

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
    Router::new()
        .route("/payments", post(create_payment).get(list_payments))
        .route("/payments/{id}", get(get_payment))
        .with_state(state)
}

/// The body of `POST /payments`. Validation happens in the handler, so a `400` for a bad
/// amount is stored and replayed like any other answer; malformed JSON is refused by the
/// extractor before the key is claimed.
#[derive(Debug, Clone, Deserialize)]
pub struct ChargeRequest {
    /// Minor units; a positive integer.
    #[serde(default)]
    pub amount: serde_json::Value,
    /// Three upper-case letters.
    #[serde(default)]
    pub currency: serde_json::Value,
}

/// A payment as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    /// `pay_…`
    pub id: String,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// `succeeded` or `declined`.
    pub status: String,
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

/// The API's errors, as problem+json.
#[derive(Debug)]
pub enum ApiError {
    /// A request that does not validate (`400`).
    Invalid(String),
    /// The card was declined (`402`); the payment is recorded.
    Declined(Payment),
    /// The gateway is down (`503`); nothing happened, retry with the same key.
    GatewayUnavailable,
    /// No such payment for this caller (`404`).
    NotFound,
    /// The demo's database failed (`500`).
    Internal(String),
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
            ApiError::Declined(payment) => {
                let mut problem = Problem::new(
                    StatusCode::PAYMENT_REQUIRED,
                    "card_declined",
                    "Card declined",
                    format!(
                        "The card was declined; payment {} is recorded as declined.",
                        payment.id
                    ),
                );
                problem.reason = Some(payment.id);
                problem
            }
            ApiError::GatewayUnavailable => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "gateway_unavailable",
                "Payment gateway unavailable",
                "Nothing was charged. Retry with the same Idempotency-Key.",
            )
            .with_retry_after(1),
            ApiError::NotFound => Problem::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "Not found",
                "No such payment for this account.",
            ),
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

impl From<sqlx::Error> for ApiError {
    fn from(err: sqlx::Error) -> Self {
        ApiError::Internal(err.to_string())
    }
}

fn validate(request: &ChargeRequest) -> Result<(i64, String), ApiError> {
    let amount = request
        .amount
        .as_i64()
        .filter(|amount| *amount > 0)
        .ok_or_else(|| {
            ApiError::Invalid("amount must be a positive integer in minor units, e.g. 10000".into())
        })?;
    match request.currency.as_str() {
        Some(currency)
            if currency.len() == 3 && currency.bytes().all(|b| b.is_ascii_uppercase()) =>
        {
            Ok((amount, currency.to_owned()))
        }
        _ => Err(ApiError::Invalid(
            "currency must be three upper-case letters, e.g. \"BRL\"".into(),
        )),
    }
}

/// `POST /payments`: charges the gateway once per idempotency key.
#[idempotent(scope = caller)]
pub async fn create_payment(
    caller: Caller,
    key: IdempotencyKey,
    State(gateway): State<Gateway>,
    Json(request): Json<ChargeRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let (amount, currency) = validate(&request)?;
    let charge = gateway
        .charge(caller.account(), amount, &currency, &key.derive("charge"))
        .await
        .map_err(|err| match err {
            GatewayError::Declined(charge) => ApiError::Declined(charge.into()),
            GatewayError::Unavailable => ApiError::GatewayUnavailable,
            GatewayError::Ledger(err) => err.into(),
        })?;
    let payment = Payment::from(charge);
    let location = HeaderValue::try_from(format!("/payments/{}", payment.id))
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(payment),
    ))
}

/// `GET /payments`: the caller's charges as the gateway recorded them.
pub async fn list_payments(
    caller: Caller,
    State(gateway): State<Gateway>,
) -> Result<Json<Vec<Payment>>, ApiError> {
    let charges = gateway.list(caller.account()).await?;
    Ok(Json(charges.into_iter().map(Payment::from).collect()))
}

/// `GET /payments/{id}`: one of the caller's charges.
pub async fn get_payment(
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
