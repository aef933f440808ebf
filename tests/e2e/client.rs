//! The client half (`idempotent-client`) against the payments demo over real TCP, with the
//! fault proxy (`idempotent_demo::fault_proxy`) dropping requests and cutting answers:
//!
//! - many concurrent payments through the middleware, one key per payment: each is charged
//!   once and its caller sees one payment id;
//! - the same payments with a fresh key per attempt (a retry layer without idempotency):
//!   the same check finds double charges, so it can tell the two apart;
//! - the demo's own gateway call behind the proxy: the derived key, reused on every
//!   attempt, keeps each payment to one charge however many attempts reach the gateway.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use futures_util::future::BoxFuture;
use http::{Extensions, StatusCode};
use idempotent_client::{CallKey, ResponseExt, RetryMiddleware, RetryPolicy};
use idempotent_demo::fault_proxy::{self, FaultRates, ProxyStats};
use idempotent_demo::gateway::api::GatewayClient;
use idempotent_runtime::testing::{Trial, async_trial};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};

use crate::support::{self, PaymentsDemo};

const PAYMENTS: i64 = 40;

/// Faults on every other connection or so: dropped before the server, cut while the
/// handler runs, or answered and the answer lost. No stalls: they only add waiting.
const RATES: FaultRates = FaultRates {
    dropped: 15,
    cut_in_flight: 15,
    answer_lost: 15,
    stalled: 0,
    stall: Duration::ZERO,
};

pub(crate) fn trials() -> Vec<Trial> {
    vec![
        async_trial(
            "concurrent_payments_through_faults_are_charged_once_each",
            concurrent_payments_through_faults_are_charged_once_each,
        ),
        async_trial(
            "a_fresh_key_per_attempt_charges_payments_twice",
            a_fresh_key_per_attempt_charges_payments_twice,
        ),
        async_trial(
            "the_demo_charges_once_through_a_faulty_gateway_connection",
            the_demo_charges_once_through_a_faulty_gateway_connection,
        ),
    ]
}

/// Retries quickly and long enough that a payment is answered despite the faults: a
/// payment fails an attempt with odds near one half, so 25 attempts leave one of 40
/// unanswered with odds near 40 × 2⁻²⁵. The demo's `409` asks for the lease's length;
/// the cap keeps the test short.
fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .with_max_attempts(25)
        .with_deadline(Duration::from_secs(60))
        .with_backoff(Duration::from_millis(10), Duration::from_millis(200))
        .with_max_retry_after(Duration::from_millis(200))
}

/// One connection per request, so the proxy decides each request's fate.
fn unpooled() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("reqwest client")
}

/// The demo's payments API on loopback behind a fault proxy; answers the proxy's address.
async fn serve_behind_proxy(app: Router, stats: Arc<ProxyStats>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    fault_proxy::start(addr, RATES, stats).await.unwrap()
}

/// What a caller ended with for payment `n` (amount `10_000 + n`).
#[derive(Debug)]
struct Paid {
    amount: i64,
    status: StatusCode,
    payment_id: String,
    attempts: u32,
}

/// Makes [`PAYMENTS`] payments at once through `client`, one [`CallKey`] each, half as
/// Alice and half as Bob.
async fn pay_concurrently(client: ClientWithMiddleware, proxy: SocketAddr) -> Vec<Paid> {
    let tasks: Vec<_> = (0..PAYMENTS)
        .map(|n| {
            let client = client.clone();
            tokio::spawn(async move {
                let amount = 10_000 + n;
                let api_key = if n % 2 == 0 {
                    "sk_test_alice"
                } else {
                    "sk_test_bob"
                };
                let response = client
                    .post(format!("http://{proxy}/payments"))
                    .with_extension(CallKey::generate())
                    .header("authorization", format!("Bearer {api_key}"))
                    .header("content-type", "application/json")
                    .body(format!(r#"{{"amount": {amount}, "currency": "BRL"}}"#))
                    .send()
                    .await
                    .unwrap_or_else(|error| panic!("payment {n} got no answer: {error:?}"));
                let status = response.status();
                let attempts = response.call_report().map_or(0, |report| report.attempts);
                let body: serde_json::Value = response.json().await.expect("JSON answer");
                Paid {
                    amount,
                    status,
                    payment_id: body["id"].as_str().unwrap_or_default().to_owned(),
                    attempts,
                }
            })
        })
        .collect();
    let mut paid = Vec::new();
    for task in tasks {
        paid.push(task.await.expect("payment task"));
    }
    paid
}

/// Each payment answered `201`, each caller saw its own payment id, and the gateway holds
/// exactly one charge per payment, the one its caller saw.
async fn charged_once_each(demo: &PaymentsDemo, paid: &[Paid]) -> Result<(), String> {
    let charges = demo.gateway.all().await.expect("charges");
    let mut per_amount: HashMap<i64, Vec<&str>> = HashMap::new();
    for charge in &charges {
        per_amount
            .entry(charge.amount)
            .or_default()
            .push(&charge.id);
    }
    let twice: Vec<_> = per_amount.iter().filter(|(_, ids)| ids.len() > 1).collect();
    if !twice.is_empty() {
        return Err(format!(
            "{} charges for {} payments; charged more than once: {twice:?}",
            charges.len(),
            paid.len()
        ));
    }
    for payment in paid {
        if payment.status != StatusCode::CREATED {
            return Err(format!("payment {payment:?} was not created"));
        }
        if per_amount.get(&payment.amount) != Some(&vec![payment.payment_id.as_str()]) {
            return Err(format!(
                "payment {payment:?} saw another id than the gateway's {:?}",
                per_amount.get(&payment.amount)
            ));
        }
    }
    let ids: HashSet<&str> = paid.iter().map(|p| p.payment_id.as_str()).collect();
    if ids.len() != paid.len() || charges.len() != paid.len() {
        return Err(format!(
            "{} payments, {} distinct ids, {} charges",
            paid.len(),
            ids.len(),
            charges.len()
        ));
    }
    Ok(())
}

/// The proxy injected faults, and the client retried through them: the checks above ran
/// against a faulty network, not a quiet one.
fn assert_faults_were_met(stats: &ProxyStats, paid: &[Paid]) {
    let faults = ProxyStats::get(&stats.dropped)
        + ProxyStats::get(&stats.cut_in_flight)
        + ProxyStats::get(&stats.answer_lost);
    assert!(faults > 0, "the proxy injected no fault");
    let attempts: u32 = paid.iter().map(|p| p.attempts).sum();
    assert!(attempts > paid.len() as u32, "no payment was retried");
}

async fn concurrent_payments_through_faults_are_charged_once_each() {
    let dir = tempfile::tempdir().unwrap();
    let demo = support::payments_demo(dir.path(), Duration::from_millis(10)).await;
    let stats = Arc::new(ProxyStats::default());
    let proxy = serve_behind_proxy(demo.app.clone(), stats.clone()).await;
    let client = ClientBuilder::new(unpooled())
        .with(RetryMiddleware::new(policy()))
        .build();
    let paid = pay_concurrently(client, proxy).await;
    assert_faults_were_met(&stats, &paid);
    if let Err(failure) = charged_once_each(&demo, &paid).await {
        panic!("{failure}");
    }
}

/// What a retry layer without idempotency does: each attempt goes out under a new key.
/// Below [`RetryMiddleware`], it replaces the key the middleware set.
fn fresh_key_per_attempt<'a>(
    mut request: reqwest::Request,
    extensions: &'a mut Extensions,
    next: Next<'a>,
) -> BoxFuture<'a, reqwest_middleware::Result<reqwest::Response>> {
    request
        .headers_mut()
        .insert("idempotency-key", CallKey::generate().header_value());
    next.run(request, extensions)
}

async fn a_fresh_key_per_attempt_charges_payments_twice() {
    let dir = tempfile::tempdir().unwrap();
    let demo = support::payments_demo(dir.path(), Duration::from_millis(10)).await;
    let stats = Arc::new(ProxyStats::default());
    let proxy = serve_behind_proxy(demo.app.clone(), stats.clone()).await;
    let fresh_keys: Arc<dyn Middleware> = Arc::new(fresh_key_per_attempt);
    let client = ClientBuilder::new(unpooled())
        .with(RetryMiddleware::new(policy()))
        .with_arc(fresh_keys)
        .build();
    let paid = pay_concurrently(client, proxy).await;
    assert_faults_were_met(&stats, &paid);
    // An answer lost after the handler ran (cut or lost: 30% of attempts) is retried
    // under a new key and charged again; 40 payments all escape that with odds near 0.7⁴⁰.
    let failure = charged_once_each(&demo, &paid)
        .await
        .expect_err("a fresh key per attempt charges some payment twice");
    assert!(failure.contains("charged more than once"), "{failure}");
}

async fn the_demo_charges_once_through_a_faulty_gateway_connection() {
    let dir = tempfile::tempdir().unwrap();
    let stats = Arc::new(ProxyStats::default());
    let proxy_stats = stats.clone();
    let demo =
        support::payments_demo_routed(dir.path(), Duration::from_millis(5), |gateway| async move {
            let proxy = fault_proxy::start(gateway, RATES, proxy_stats)
                .await
                .unwrap();
            GatewayClient::with_http(proxy, unpooled())
        })
        .await;
    // In-process requests: the faults are all on the gateway's connection. A payment the
    // gateway client gave up on (`503`) is retried under its key, as its caller would.
    let tasks: Vec<_> = (0..PAYMENTS)
        .map(|n| {
            let app = demo.app.clone();
            tokio::spawn(async move {
                let amount = 10_000 + n;
                let body = format!(r#"{{"amount": {amount}, "currency": "BRL"}}"#);
                let key = format!("order-{n}");
                for tries in 1..=10 {
                    let answer = support::send(
                        &app,
                        support::post_payment("sk_test_alice", Some(&key), &body),
                    )
                    .await;
                    if answer.status == StatusCode::SERVICE_UNAVAILABLE {
                        assert_eq!(answer.code(), "gateway_unreachable");
                        continue;
                    }
                    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
                    return Paid {
                        amount,
                        status: answer.status,
                        payment_id: answer.json()["id"].as_str().unwrap().to_owned(),
                        attempts: tries,
                    };
                }
                panic!("payment {n}: the gateway stayed unreachable");
            })
        })
        .collect();
    let mut paid = Vec::new();
    for task in tasks {
        paid.push(task.await.expect("payment task"));
    }
    if let Err(failure) = charged_once_each(&demo, &paid).await {
        panic!("{failure}");
    }
    // Some charges were asked for more than once and deduplicated by their key.
    let calls = demo.gateway.calls().await.unwrap();
    assert!(
        calls > PAYMENTS,
        "{calls} gateway calls for {PAYMENTS} payments: no attempt was retried"
    );
    assert!(ProxyStats::get(&stats.answer_lost) + ProxyStats::get(&stats.cut_in_flight) > 0);
}
