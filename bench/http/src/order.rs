//! The one handler every variant serves, so the variants differ only in their
//! idempotency layer: parse a 1 KiB JSON order, answer `201` with a JSON receipt.
//!
//! This file is compiled into both benchmark servers (the rustango peer includes it by
//! path), so it depends on axum, serde and tokio only.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Json;
use axum::extract::{FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::{Deserialize, Serialize};

/// How long the slow route's handler takes: long enough for 50 concurrent duplicates to
/// all arrive while the first one still runs.
pub const SLOW_HANDLER: Duration = Duration::from_millis(100);

/// A customer's order, the request body (the driver sends `wrk/order.json`, 1 KiB).
#[derive(Debug, Deserialize)]
pub struct Order {
    customer: String,
    currency: String,
    items: Vec<Item>,
    shipping: Address,
    note: String,
}

/// One line of an [`Order`].
#[derive(Debug, Deserialize)]
struct Item {
    sku: String,
    quantity: u32,
    unit_price: u64,
}

/// Where an [`Order`] ships.
#[derive(Debug, Deserialize)]
struct Address {
    name: String,
    street: String,
    city: String,
    postal_code: String,
    country: String,
}

/// The `201` body.
#[derive(Debug, Serialize)]
pub struct Receipt {
    id: String,
    account: String,
    customer: String,
    currency: String,
    lines: usize,
    total: u64,
    ships_to: String,
    note_chars: usize,
}

/// How many times each handler started: the duplicates test reads them through
/// `GET /stats` before and after its burst.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    orders: Arc<AtomicU64>,
    slow_orders: Arc<AtomicU64>,
}

/// `GET /stats`.
#[derive(Debug, Serialize)]
pub struct Stats {
    orders: u64,
    slow_orders: u64,
}

/// The authenticated caller, from `Authorization: Bearer <account>`. The driver sends one
/// account; the idempotent variants scope keys by it, rustango keys by the header.
#[derive(Debug)]
pub struct Caller {
    pub account: String,
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, StatusCode> {
        parts
            .headers
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(|account| Caller {
                account: account.to_owned(),
            })
            .ok_or(StatusCode::UNAUTHORIZED)
    }
}

/// The handler's work, shared by the fast and the slow route.
pub fn place_order(caller: &Caller, order: Order, sequence: u64) -> (StatusCode, Json<Receipt>) {
    let total = order
        .items
        .iter()
        .map(|item| u64::from(item.quantity) * item.unit_price)
        .sum();
    let skus: usize = order.items.iter().map(|item| item.sku.len()).sum();
    let receipt = Receipt {
        id: format!("ord_{sequence:012}_{skus}"),
        account: caller.account.clone(),
        customer: order.customer,
        currency: order.currency,
        lines: order.items.len(),
        total,
        ships_to: format!(
            "{}, {}, {} {}, {}",
            order.shipping.name,
            order.shipping.street,
            order.shipping.postal_code,
            order.shipping.city,
            order.shipping.country
        ),
        note_chars: order.note.chars().count(),
    };
    (StatusCode::CREATED, Json(receipt))
}

impl Counters {
    /// Counts one run of the fast handler; returns its sequence number.
    pub fn order_started(&self) -> u64 {
        self.orders.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Counts one run of the slow handler; returns its sequence number.
    pub fn slow_order_started(&self) -> u64 {
        self.slow_orders.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// `POST /orders` for the variants whose layer is middleware (bare, axum-idempotent,
/// rustango), and the handler the hand-written floor and fingerprint-only call after
/// their own reading of the request (`floor_app.rs`).
pub async fn create_order(
    caller: Caller,
    State(counters): State<Counters>,
    Json(order): Json<Order>,
) -> (StatusCode, Json<Receipt>) {
    let sequence = counters.order_started();
    place_order(&caller, order, sequence)
}

/// `POST /orders/slow`: [`create_order`] after [`SLOW_HANDLER`].
pub async fn create_slow_order(
    caller: Caller,
    State(counters): State<Counters>,
    Json(order): Json<Order>,
) -> (StatusCode, Json<Receipt>) {
    let sequence = counters.slow_order_started();
    tokio::time::sleep(SLOW_HANDLER).await;
    place_order(&caller, order, sequence)
}

/// `GET /stats`: handler executions so far.
pub async fn stats(State(counters): State<Counters>) -> Json<Stats> {
    Json(Stats {
        orders: counters.orders.load(Ordering::Relaxed),
        slow_orders: counters.slow_orders.load(Ordering::Relaxed),
    })
}
