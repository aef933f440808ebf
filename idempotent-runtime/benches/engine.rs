//! The engine driven the way a server drives it: batches of 64 concurrent requests, each
//! in a task of its own (as Hyper runs each connection) on a 2-worker multi-thread
//! runtime, through an axum `Router` and an `#[idempotent]` handler (key extraction,
//! body buffering, fingerprint, claim, handler, record or replay), on the memory store.
//! Next to it the same handler without idempotency (`bare`), so the figures read as the
//! framework's overhead per request.
//!
//! - `fresh`: every request a new key (claim, handler, completion);
//! - `replay`: keys completed beforehand, cycled through (1,000 of them): answered from
//!   the replay cache;
//! - `replay_uncached`: the same with the replay cache off (`replay_cache(None)`): every
//!   replay is the store's.
//!
//! Throughput is per request (`elements`); compare runs with criterion's baselines
//! (`--save-baseline before` on one commit, `--baseline before` on the next).

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use axum::extract::{FromRef, FromRequestParts, Json};
use axum::http::request::Parts;
use axum::routing::post;
use axum::{Router, http::StatusCode};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http::Request;
use http_body_util::BodyExt;
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::{Idempotency, Scope, idempotent};
use serde::{Deserialize, Serialize};
use tower::ServiceExt;

/// Requests in flight at once: wrk's 64 connections in the HTTP benchmark.
const CONCURRENCY: usize = 64;
/// Completed keys the replay benches cycle through.
const REPLAY_KEYS: u64 = 1_000;

const BODY: &str = r#"{"customer":"cus_123","currency":"EUR","items":[{"sku":"sku_1","quantity":2,"unit_price":1250},{"sku":"sku_2","quantity":1,"unit_price":990}]}"#;

#[derive(Debug, Deserialize)]
struct Order {
    customer: String,
    currency: String,
    items: Vec<Item>,
}

#[derive(Debug, Deserialize)]
struct Item {
    sku: String,
    quantity: u64,
    unit_price: u64,
}

#[derive(Debug, Serialize)]
struct Receipt {
    id: u64,
    customer: String,
    currency: String,
    total: u64,
    skus: usize,
}

/// The caller, from `Authorization: Bearer <account>`.
struct Caller(String);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, StatusCode> {
        parts
            .headers
            .get(http::header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(|account| Caller(account.to_owned()))
            .ok_or(StatusCode::UNAUTHORIZED)
    }
}

impl Scope for Caller {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.0)
    }
}

#[derive(Clone)]
struct AppState {
    idempotency: Idempotency,
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.idempotency.clone()
    }
}

static ORDERS: AtomicU64 = AtomicU64::new(0);

fn receipt(order: Order) -> (StatusCode, Json<Receipt>) {
    let receipt = Receipt {
        id: ORDERS.fetch_add(1, Ordering::Relaxed),
        total: order
            .items
            .iter()
            .map(|item| item.quantity * item.unit_price)
            .sum(),
        skus: order
            .items
            .iter()
            .filter(|item| !item.sku.is_empty())
            .count(),
        customer: order.customer,
        currency: order.currency,
    };
    (StatusCode::CREATED, Json(receipt))
}

#[idempotent(scope = caller)]
async fn create_order(caller: Caller, Json(order): Json<Order>) -> (StatusCode, Json<Receipt>) {
    let _ = caller;
    receipt(order)
}

async fn bare_order(_caller: Caller, Json(order): Json<Order>) -> (StatusCode, Json<Receipt>) {
    receipt(order)
}

fn idempotent_router(idempotency: Idempotency) -> Router {
    Router::new()
        .route("/orders", post(create_order))
        .with_state(AppState { idempotency })
}

fn order_request(key: Option<&str>) -> Request<Body> {
    let mut request = Request::post("/orders")
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::AUTHORIZATION, "Bearer acct_bench");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request.body(Body::from(BODY)).expect("request")
}

/// One request through `router`, its body read whole, as a server writes it out.
async fn send(router: Router, key: Option<String>) {
    let response = router
        .oneshot(order_request(key.as_deref()))
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::CREATED);
    let body = response.into_body().collect().await.expect("body");
    std::hint::black_box(body);
}

/// [`CONCURRENCY`] requests at once, each in a task of its own; `key(i)` names request
/// `i`'s key.
async fn batch(router: &Router, key: impl Fn() -> Option<String>) {
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| tokio::spawn(send(router.clone(), key())))
        .collect();
    for task in tasks {
        task.await.expect("request task");
    }
}

fn engine(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("engine/memory");
    group.throughput(Throughput::Elements(CONCURRENCY as u64));

    let bare = Router::new().route("/orders", post(bare_order));
    group.bench_function("bare", |b| {
        b.to_async(&runtime).iter(|| batch(&bare, || None))
    });

    let next_key = Arc::new(AtomicU64::new(0));
    let fresh = idempotent_router(Idempotency::new(MemoryStore::new()));
    group.bench_function("fresh", |b| {
        b.to_async(&runtime).iter(|| {
            batch(&fresh, || {
                Some(format!(
                    "fresh-{}",
                    next_key.fetch_add(1, Ordering::Relaxed)
                ))
            })
        })
    });

    let cached = Idempotency::new(MemoryStore::new());
    let uncached = Idempotency::builder(MemoryStore::new())
        .replay_cache(None)
        .build();
    for (name, engine) in [("replay", cached), ("replay_uncached", uncached)] {
        let router = idempotent_router(engine);
        runtime.block_on(async {
            for i in 0..REPLAY_KEYS {
                send(router.clone(), Some(format!("replay-{i}"))).await;
            }
        });
        let cursor = AtomicU64::new(0);
        group.bench_function(name, |b| {
            b.to_async(&runtime).iter(|| {
                batch(&router, || {
                    let i = cursor.fetch_add(1, Ordering::Relaxed) % REPLAY_KEYS;
                    Some(format!("replay-{i}"))
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, engine);
criterion_main!(benches);
