//! Several OS processes of the payments demo on different ports sharing one store —
//! Postgres, MySQL/MariaDB, Redis or a Redis Cluster, chosen by the demo's URL: the retry
//! that matters lands on another instance than the original.
//!
//! Each server's tests need its URL (`IDEMPOTENT_TEST_POSTGRES_URL`,
//! `IDEMPOTENT_TEST_MYSQL_URL`, `IDEMPOTENT_TEST_REDIS_URL`,
//! `IDEMPOTENT_TEST_REDIS_CLUSTER_URL`); without it they are reported ignored (the reason
//! printed once). Each test creates and removes its own database (or Redis key prefix).

use std::future::Future;
use std::time::Duration;

use idempotent_runtime::testing::{Trial, async_trial, ignored_if};
use reqwest::StatusCode;

use crate::support::process::{self, Instance, Server, TestBackend};

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

/// The demo on `backend` with `flags`.
async fn start(backend: &TestBackend, flags: &[&str]) -> Instance {
    let mut all: Vec<&str> = backend.flags.iter().map(String::as_str).collect();
    all.extend_from_slice(flags);
    Instance::start(DEMO, &backend.url, &all).await
}

pub(crate) fn trials() -> Vec<Trial> {
    let mut trials = Vec::new();
    for server in [
        Server::Postgres,
        Server::MySql,
        Server::Redis,
        Server::RedisCluster,
    ] {
        let on = |name: &str, test: fn(Server) -> std::pin::Pin<Box<dyn Future<Output = ()>>>| {
            async_trial(format!("{}::{name}", server.name()), move || test(server))
        };
        trials.extend(ignored_if(
            server.unavailable(),
            vec![
                on("fifty_duplicates_over_three_instances_charge_once", |s| {
                    Box::pin(fifty_duplicates_over_three_instances_charge_once(s))
                }),
                on(
                    "fifty_duplicates_with_wait_over_three_instances_replay",
                    |s| Box::pin(fifty_duplicates_with_wait_over_three_instances_replay(s)),
                ),
                on("a_retry_on_another_instance_replays", |s| {
                    Box::pin(a_retry_on_another_instance_replays(s))
                }),
                on(
                    "killed_owner_blocks_until_its_lease_ends_then_one_takeover_charges",
                    |s| {
                        Box::pin(
                            killed_owner_blocks_until_its_lease_ends_then_one_takeover_charges(s),
                        )
                    },
                ),
            ],
        ));
    }
    for (url, shown, secret) in [
        (
            "postgres://app:hunter2@127.0.0.1:1/payments",
            "postgres://app:***@127.0.0.1:1/payments",
            "hunter2",
        ),
        (
            "mysql://app:hunter2@127.0.0.1:1/payments",
            "mysql://app:***@127.0.0.1:1/payments",
            "hunter2",
        ),
    ] {
        let scheme = url.split(':').next().unwrap_or_default().to_owned();
        let server = if scheme == "mysql" {
            Server::MySql
        } else {
            Server::Postgres
        };
        // Needs no server, only the store compiled in.
        let not_built = server
            .unavailable()
            .filter(|reason| reason.starts_with("built"));
        trials.extend(ignored_if(
            not_built,
            vec![async_trial(
                format!("{scheme}::unreachable_server_at_start_names_the_url_without_the_password"),
                move || {
                    unreachable_server_at_start_names_the_url_without_the_password(
                        url, shown, secret,
                    )
                },
            )],
        ));
    }
    trials
}

/// 50 requests with one key spread over three instances, at once: the answers (status,
/// has `Retry-After`, replayed) and how many gateway calls were made.
async fn fifty_duplicates(
    server: Server,
    name: &str,
    flags: &[&str],
) -> (Vec<(StatusCode, bool, bool)>, i64) {
    let backend = TestBackend::create(server, name).await;
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(start(&backend, flags).await);
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
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    (answers, backend.gateway_calls().await)
}

async fn fifty_duplicates_over_three_instances_charge_once(server: Server) {
    let (answers, gateway_calls) =
        fifty_duplicates(server, "fifty", &["--gateway-latency-ms", "300"]).await;
    let mut originals = 0;
    for answer in answers {
        match answer {
            (StatusCode::CREATED, _, true) => {}
            (StatusCode::CREATED, _, false) => originals += 1,
            (StatusCode::CONFLICT, has_retry_after, _) => {
                assert!(has_retry_after, "409 carries Retry-After")
            }
            (other, _, _) => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(originals, 1, "exactly one answer is not a replay");
    assert_eq!(gateway_calls, 1, "exactly one gateway call");
}

/// With `--wait`, the duplicates that find the charge running wait for it (on Postgres
/// woken by `LISTEN/NOTIFY`, elsewhere by a bounded poll) and all get its replay.
async fn fifty_duplicates_with_wait_over_three_instances_replay(server: Server) {
    let flags = ["--gateway-latency-ms", "500", "--wait", "60s"];
    let (answers, gateway_calls) = fifty_duplicates(server, "fiftywait", &flags).await;
    let count = |wanted: (StatusCode, bool)| {
        answers
            .iter()
            .filter(|(status, _, replayed)| (*status, *replayed) == wanted)
            .count()
    };
    assert_eq!(count((StatusCode::CREATED, false)), 1, "{answers:?}");
    assert_eq!(count((StatusCode::CREATED, true)), 49, "{answers:?}");
    assert_eq!(gateway_calls, 1, "exactly one gateway call");
}

async fn a_retry_on_another_instance_replays(server: Server) {
    let backend = TestBackend::create(server, "replay").await;
    let a = start(&backend, &["--gateway-latency-ms", "0"]).await;
    let b = start(&backend, &["--gateway-latency-ms", "0"]).await;
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
    assert_eq!(backend.gateway_calls().await, 1);
}

async fn killed_owner_blocks_until_its_lease_ends_then_one_takeover_charges(server: Server) {
    let backend = TestBackend::create(server, "kill").await;
    let flags = ["--gateway-latency-ms", "1500", "--lease", "3s"];
    let mut a = start(&backend, &flags).await;
    let b = start(&backend, &flags).await;
    let c = start(&backend, &flags).await;
    let client = reqwest::Client::new();

    let in_flight = process::charge_in_flight(&client, a.url("/payments"), "crash-1", CHARGE);
    process::wait_until("the original is claimed", || backend.claimed("crash-1")).await;
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
    assert_eq!(backend.gateway_calls().await, 1, "exactly one charge");
}

async fn unreachable_server_at_start_names_the_url_without_the_password(
    url: &'static str,
    shown: &'static str,
    secret: &'static str,
) {
    let output = std::process::Command::new(DEMO)
        // Refused at every attempt: waits its second for the database, then gives up.
        .args([
            "--addr",
            "127.0.0.1:0",
            "--database-url",
            url,
            "--database-wait",
            "1s",
        ])
        .env("RUST_LOG", "off")
        .output()
        .expect("run demo");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(shown), "stderr: {stderr}");
    assert!(!stderr.contains(secret), "password leaked: {stderr}");
}
