//! The fake gateway's HTTP API, served on loopback as a provider serves its own, and the
//! demo's client of it, which calls it through `idempotent-client`.
//!
//! `POST /v1/charges` with `{"account", "amount", "currency"}` and an `Idempotency-Key`
//! (the handler's `key.derive("authorise")`) answers:
//!
//! - `200` and the [`Charge`]: charged, or the charge an earlier call with the same key
//!   made (then with `Idempotent-Replayed: true`);
//! - `402` and the declined [`Charge`] (recorded);
//! - `503`: unavailable, nothing recorded;
//! - `400` without a valid key; `500` when the gateway's ledger fails.
//!
//! `GET /v1/charges?reference=KEY` answers `200` and the charges made under that key (a
//! JSON array): how a caller finds out whether a call whose answer it lost took effect.
//!
//! The client retries a call whose answer is lost, or that met a `503`, with the same key,
//! so the gateway charges each payment once however many attempts reach it.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use http::{HeaderMap, HeaderName, StatusCode};
use idempotent_client::{CallKey, ResponseExt, RetryMiddleware, RetryPolicy};
use reqwest_middleware::ClientWithMiddleware;
use serde::{Deserialize, Serialize};

use super::{Charge, Gateway, GatewayError};

/// The header the gateway deduplicates on.
const KEY_HEADER: HeaderName = HeaderName::from_static("idempotency-key");

/// The body of `POST /v1/charges`.
#[derive(Debug, Serialize, Deserialize)]
struct ChargeRequest {
    account: String,
    amount: i64,
    currency: String,
}

/// The query of `GET /v1/charges`.
#[derive(Debug, Serialize, Deserialize)]
struct ChargesQuery {
    reference: String,
}

/// The gateway's API: `POST /v1/charges`, `GET /v1/charges?reference=…`.
pub fn router(gateway: Gateway) -> Router {
    Router::new()
        .route("/v1/charges", post(create_charge).get(find_charges))
        .with_state(gateway)
}

async fn find_charges(
    State(gateway): State<Gateway>,
    Query(query): Query<ChargesQuery>,
) -> Response {
    match gateway.find_by_reference(&query.reference).await {
        Ok(charges) => (StatusCode::OK, Json(charges)).into_response(),
        Err(error) if crate::database::is_transient(&error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(http::header::RETRY_AFTER, "1")],
            error.to_string(),
        )
            .into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

/// Serves [`router`] on `addr` (port 0: a free one) in a task of the current runtime, and
/// answers the address it listens on.
pub async fn serve(gateway: Gateway, addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let app = router(gateway);
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "the fake gateway stopped serving");
        }
    });
    Ok(addr)
}

async fn create_charge(
    State(gateway): State<Gateway>,
    headers: HeaderMap,
    Json(request): Json<ChargeRequest>,
) -> Response {
    let key = match idempotent_runtime::key::parse_header(&headers, &KEY_HEADER) {
        Ok(key) => key,
        Err(error) => return (StatusCode::BAD_REQUEST, error.to_string()).into_response(),
    };
    let charged = gateway
        .charge(&request.account, request.amount, &request.currency, &key)
        .await;
    match charged {
        Ok((charge, true)) => (StatusCode::OK, Json(charge)).into_response(),
        Ok((charge, false)) => (
            StatusCode::OK,
            [(idempotent_runtime::engine::REPLAYED_HEADER, "true")],
            Json(charge),
        )
            .into_response(),
        Err(GatewayError::Declined(charge)) => {
            (StatusCode::PAYMENT_REQUIRED, Json(charge)).into_response()
        }
        Err(GatewayError::Unavailable) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        // Its ledger's database is away for a moment (a restart): nothing was charged,
        // and a caller's retry is what the outage needs, not a `500` it would stop at.
        Err(GatewayError::Ledger(error)) if crate::database::is_transient(&error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(http::header::RETRY_AFTER, "1")],
            error.to_string(),
        )
            .into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

/// The demo's client of the gateway's API: every charge goes through
/// [`RetryMiddleware`], keyed by the downstream key it is given.
#[derive(Debug, Clone)]
pub struct GatewayClient {
    http: ClientWithMiddleware,
    charges_url: String,
}

impl GatewayClient {
    /// A client of the gateway at `addr`, retrying as [`GatewayClient::policy`] says.
    pub fn new(addr: SocketAddr) -> Self {
        Self::with_http(addr, reqwest::Client::new())
    }

    /// [`new`](Self::new) over `http` (a client that opens one connection per request,
    /// say, so that a fault proxy decides the fate of each).
    pub fn with_http(addr: SocketAddr, http: reqwest::Client) -> Self {
        let http = reqwest_middleware::ClientBuilder::new(http)
            .with(RetryMiddleware::new(Self::policy()))
            .build();
        Self {
            http,
            charges_url: format!("http://{addr}/v1/charges"),
        }
    }

    /// How the demo retries the gateway: a few attempts within a deadline well inside
    /// the handler's lease, so a gateway that stays down is answered `503` soon and the
    /// payment's own client retries the whole request later.
    pub fn policy() -> RetryPolicy {
        RetryPolicy::default()
            .with_max_attempts(4)
            .with_deadline(Duration::from_secs(10))
            .with_backoff(Duration::from_millis(20), Duration::from_millis(500))
            .with_max_retry_after(Duration::from_secs(2))
    }

    /// Charges `amount` to `account` under `downstream_key`: the same key on every attempt,
    /// so the gateway charges once however many attempts reach it.
    pub async fn charge(
        &self,
        account: &str,
        amount: i64,
        currency: &str,
        downstream_key: &str,
    ) -> Result<Charge, GatewayError> {
        let key = CallKey::new(downstream_key)
            .map_err(|error| GatewayError::Protocol(format!("downstream key: {error}")))?;
        let request = ChargeRequest {
            account: account.to_owned(),
            amount,
            currency: currency.to_owned(),
        };
        let response = self
            .http
            .post(&self.charges_url)
            .with_extension(key)
            .json(&request)
            .send()
            .await
            .map_err(|error| GatewayError::Unreachable(error.to_string()))?;
        if response.is_replayed() {
            tracing::info!(
                downstream_key,
                "the gateway had charged this key already: its charge is the answer"
            );
        }
        let status = response.status();
        match status {
            StatusCode::OK | StatusCode::PAYMENT_REQUIRED => {
                let charge: Charge = response
                    .json()
                    .await
                    .map_err(|error| GatewayError::Unreachable(error.to_string()))?;
                if status == StatusCode::OK {
                    Ok(charge)
                } else {
                    Err(GatewayError::Declined(charge))
                }
            }
            StatusCode::SERVICE_UNAVAILABLE => Err(GatewayError::Unavailable),
            other => {
                let body = response.text().await.unwrap_or_default();
                Err(GatewayError::Protocol(format!("{other}: {body}")))
            }
        }
    }

    /// The first charge made under `reference` (a downstream key), if any: whether a
    /// charge whose answer was lost took effect. A `GET`, retried as the policy says.
    pub async fn find(&self, reference: &str) -> Result<Option<Charge>, GatewayError> {
        let url = reqwest::Url::parse_with_params(&self.charges_url, [("reference", reference)])
            .map_err(|error| GatewayError::Protocol(format!("reference: {error}")))?;
        let response = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|error| GatewayError::Unreachable(error.to_string()))?;
        match response.status() {
            StatusCode::OK => {
                let charges: Vec<Charge> = response
                    .json()
                    .await
                    .map_err(|error| GatewayError::Unreachable(error.to_string()))?;
                Ok(charges.into_iter().next())
            }
            StatusCode::SERVICE_UNAVAILABLE => Err(GatewayError::Unavailable),
            other => {
                let body = response.text().await.unwrap_or_default();
                Err(GatewayError::Protocol(format!("{other}: {body}")))
            }
        }
    }
}
