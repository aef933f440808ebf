//! Several OS processes of the payments demo on different ports, one Postgres: the
//! retry that matters lands on another instance than the original.
//!
//! Needs `IDEMPOTENT_TEST_POSTGRES_URL`; each test creates and drops its own database.
#![cfg(feature = "postgres")]

#[path = "support/process.rs"]
mod process;

use std::time::Duration;

use process::{Instance, TestDatabase};
use reqwest::StatusCode;

const DEMO: &str = env!("CARGO_BIN_EXE_payments-demo");
const CHARGE: &str = r#"{"amount": 10000, "currency": "BRL"}"#;

async fn post(client: &reqwest::Client, instance: &Instance, key: &str) -> reqwest::Response {
    client
        .post(instance.url("/payments"))
        .header("authorization", "Bearer sk_test_alice")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(CHARGE)
        .send()
        .await
        .expect("request")
}

async fn charges(db: &TestDatabase) -> i64 {
    let pool = db.pool().await;
    // Gateway calls, not charges: the gateway deduplicates by downstream key, so only
    // its call log shows a handler that ran twice.
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM demo_gateway_calls")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_duplicates_over_three_instances_charge_once() {
    let Some(db) = TestDatabase::create("fifty").await else {
        return;
    };
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(Instance::start(DEMO, &db.url, &["--gateway-latency-ms", "300"]).await);
    }
    let instances = std::sync::Arc::new(instances);
    let client = reqwest::Client::new();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(50));
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let (client, instances, barrier) = (client.clone(), instances.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let response = post(&client, &instances[i % 3], "dup-50").await;
                (
                    response.status(),
                    response.headers().get("retry-after").is_some(),
                    response.headers().get("idempotent-replayed").is_some(),
                )
            })
        })
        .collect();
    let mut originals = 0;
    for task in tasks {
        match task.await.unwrap() {
            (StatusCode::CREATED, _, true) => {}
            (StatusCode::CREATED, _, false) => originals += 1,
            (StatusCode::CONFLICT, has_retry_after, _) => {
                assert!(has_retry_after, "409 carries Retry-After")
            }
            (other, _, _) => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(originals, 1, "exactly one answer is not a replay");
    assert_eq!(charges(&db).await, 1, "exactly one gateway call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_another_instance_replays() {
    let Some(db) = TestDatabase::create("replay").await else {
        return;
    };
    let a = Instance::start(DEMO, &db.url, &["--gateway-latency-ms", "0"]).await;
    let b = Instance::start(DEMO, &db.url, &["--gateway-latency-ms", "0"]).await;
    let client = reqwest::Client::new();
    let first = post(&client, &a, "order-1").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let location = first.headers()["location"].clone();
    let first_body = first.bytes().await.unwrap();
    let retry = post(&client, &b, "order-1").await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.headers()["location"], location);
    assert_eq!(retry.bytes().await.unwrap(), first_body);
    assert_eq!(charges(&db).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_owner_blocks_until_its_lease_ends_then_one_takeover_charges() {
    let Some(db) = TestDatabase::create("kill").await else {
        return;
    };
    let flags = ["--gateway-latency-ms", "1500", "--lease", "3s"];
    let mut a = Instance::start(DEMO, &db.url, &flags).await;
    let b = Instance::start(DEMO, &db.url, &flags).await;
    let c = Instance::start(DEMO, &db.url, &flags).await;
    let client = reqwest::Client::new();

    let in_flight = {
        let (client, url) = (client.clone(), a.url("/payments"));
        tokio::spawn(async move {
            client
                .post(url)
                .header("authorization", "Bearer sk_test_alice")
                .header("idempotency-key", "crash-1")
                .header("content-type", "application/json")
                .body(CHARGE)
                .send()
                .await
        })
    };
    let pool = db.pool().await;
    process::wait_until("the original is claimed", || {
        process::claimed(&pool, "crash-1")
    })
    .await;
    a.kill(); // kill -9 while the gateway call (1.5 s) is in flight
    assert!(
        in_flight.await.unwrap().is_err(),
        "the client lost its connection"
    );

    let blocked = post(&client, &b, "crash-1").await;
    assert_eq!(
        blocked.status(),
        StatusCode::CONFLICT,
        "the dead owner's lease still holds"
    );
    let retry_after: u64 = blocked.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (1..=3).contains(&retry_after),
        "Retry-After {retry_after} within the lease"
    );

    let mut outcome = None;
    for attempt in 0..60 {
        let instance = if attempt % 2 == 0 { &b } else { &c };
        let response = post(&client, instance, "crash-1").await;
        if response.status() != StatusCode::CONFLICT {
            outcome = Some(response.status());
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        outcome,
        Some(StatusCode::CREATED),
        "taken over after the lease"
    );
    let replay = post(&client, &c, "crash-1").await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(charges(&db).await, 1, "exactly one charge");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_postgres_at_start_names_the_url_without_the_password() {
    let output = std::process::Command::new(DEMO)
        .args([
            "--addr",
            "127.0.0.1:0",
            "--database-url",
            "postgres://app:hunter2@127.0.0.1:1/payments",
        ])
        .env("RUST_LOG", "off")
        .output()
        .expect("run demo");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("postgres://app:***@127.0.0.1:1/payments"),
        "stderr: {stderr}"
    );
    assert!(!stderr.contains("hunter2"), "password leaked: {stderr}");
}
