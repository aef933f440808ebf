//! The handler behind `#[idempotent]`: the engine claims the key, runs the handler once
//! and replays its answer.

use std::borrow::Cow;
use std::sync::Arc;

use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use idempotent_runtime::{Idempotency, Scope, Store, idempotent};

use crate::order::{self, Caller, Counters, Order, Receipt};

/// The router state: the engine and the execution counters.
#[derive(Clone)]
struct AppState {
    idempotency: Idempotency,
    counters: Counters,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.idempotency.clone()
    }
}

impl FromRef<AppState> for Counters {
    fn from_ref(state: &AppState) -> Self {
        state.counters.clone()
    }
}

impl Scope for Caller {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.account)
    }
}

/// `POST /orders`: the shared handler, claimed per (caller, key).
#[idempotent(scope = caller, ttl = "10m")]
async fn create_order(
    caller: Caller,
    State(counters): State<Counters>,
    Json(order): Json<Order>,
) -> (StatusCode, Json<Receipt>) {
    let sequence = counters.order_started();
    order::place_order(&caller, order, sequence)
}

/// `POST /orders/slow`: the same after [`order::SLOW_HANDLER`].
#[idempotent(scope = caller, ttl = "10m")]
async fn create_slow_order(
    caller: Caller,
    State(counters): State<Counters>,
    Json(order): Json<Order>,
) -> (StatusCode, Json<Receipt>) {
    let sequence = counters.slow_order_started();
    tokio::time::sleep(order::SLOW_HANDLER).await;
    order::place_order(&caller, order, sequence)
}

/// The app over `store`, and its engine (to drain on shutdown). `BENCH_REPLAY_CACHE=off`
/// builds the engine without its replay cache (`mix.sh`'s A/B).
pub fn router(store: Arc<dyn Store>, counters: Counters) -> (Router, Idempotency) {
    let mut builder = Idempotency::builder_shared(store);
    if std::env::var("BENCH_REPLAY_CACHE").as_deref() == Ok("off") {
        builder = builder.replay_cache(None);
    }
    let idempotency = builder.build();
    (router_with(idempotency.clone(), counters), idempotency)
}

/// The app on an engine built by the caller (the scale benchmark turns its replay cache
/// off).
pub fn router_with(idempotency: Idempotency, counters: Counters) -> Router {
    let state = AppState {
        idempotency,
        counters,
    };
    Router::new()
        .route("/orders", post(create_order))
        .route("/orders/slow", post(create_slow_order))
        .route("/stats", get(order::stats))
        .with_state(state)
}
