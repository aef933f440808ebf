//! The payments demo on Postgres through a TCP proxy the test can cut: while the
//! database is unreachable requests get `503` problem+json (except replays of keys the
//! instance's replay cache holds), and once it is back the same process recovers —
//! without running any request twice.
//!
//! Cutting the proxy closes every open connection and refuses new ones, which is what an
//! app sees of a Postgres restart, without disturbing the tests that share the server.
//!
//! Needs `IDEMPOTENT_TEST_POSTGRES_URL`; without it the test is reported ignored.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotent_runtime::testing::{Trial, async_trial, ignored_if};
use reqwest::StatusCode;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::support::process::{self, Instance, Server, TestDatabase};

const DEMO: &str = env!("CARGO_BIN_EXE_payments-demo");

/// A TCP proxy to Postgres that can be cut and restored on the same port.
struct Proxy {
    port: u16,
    upstream: String,
    accept: Option<JoinHandle<()>>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut proxy = Proxy {
            port,
            upstream,
            accept: None,
            connections: Arc::default(),
        };
        proxy.serve(listener);
        proxy
    }

    fn serve(&mut self, listener: TcpListener) {
        let (upstream, connections) = (self.upstream.clone(), self.connections.clone());
        self.accept = Some(tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                connections.lock().unwrap().push(task);
            }
        }));
    }

    /// Refuses new connections and closes the open ones.
    fn cut(&mut self) {
        if let Some(accept) = self.accept.take() {
            accept.abort();
        }
        for task in self.connections.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    /// A proxy to `upstream` on a port of its own where nothing listens yet: a database
    /// that is still down. [`restore`](Self::restore) brings it up.
    async fn down(upstream: String) -> Proxy {
        let port = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Proxy {
            port,
            upstream,
            accept: None,
            connections: Arc::default(),
        }
    }

    async fn restore(&mut self) {
        let mut listener = None;
        for _ in 0..100 {
            match TcpListener::bind(("127.0.0.1", self.port)).await {
                Ok(bound) => {
                    listener = Some(bound);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        self.serve(listener.expect("rebind the proxy port"));
    }
}

/// `url` with its host and port replaced by `127.0.0.1:port`.
fn via_port(url: &str, port: u16) -> String {
    let scheme_end = url.find("://").unwrap() + 3;
    let rest = &url[scheme_end..];
    let host_start = rest.find('@').map_or(0, |at| at + 1);
    let host_end = rest[host_start..]
        .find('/')
        .map_or(rest.len(), |i| host_start + i);
    format!(
        "{}{}127.0.0.1:{port}{}",
        &url[..scheme_end],
        &rest[..host_start],
        &rest[host_end..]
    )
}

fn upstream_of(url: &str) -> String {
    let rest = &url[url.find("://").unwrap() + 3..];
    let host_start = rest.find('@').map_or(0, |at| at + 1);
    let host_end = rest[host_start..]
        .find(['/', '?'])
        .map_or(rest.len(), |i| host_start + i);
    let host = &rest[host_start..host_end];
    if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5432")
    }
}

async fn post(
    client: &reqwest::Client,
    instance: &Instance,
    key: &str,
    amount: u32,
) -> (StatusCode, serde_json::Value, bool) {
    let response = client
        .post(instance.url("/payments"))
        .header("authorization", "Bearer sk_test_alice")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(format!(r#"{{"amount": {amount}, "currency": "BRL"}}"#))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("the demo answers even while its database is down");
    let status = response.status();
    let replayed = response.headers().get("idempotent-replayed").is_some();
    let body = response.json().await.unwrap_or(serde_json::Value::Null);
    (status, body, replayed)
}

pub(crate) fn trials() -> Vec<Trial> {
    ignored_if(
        Server::Postgres.unavailable(),
        vec![
            async_trial(
                "database_outage_is_503_then_recovers_without_double_execution",
                database_outage_is_503_then_recovers_without_double_execution,
            ),
            async_trial(
                "an_instance_started_before_its_database_waits_for_it",
                an_instance_started_before_its_database_waits_for_it,
            ),
        ],
    )
}

/// An instance started while its database is down (a restart of both, a deploy during a
/// database failover) waits for it, saying so, instead of exiting; once the database
/// listens it opens the store and serves.
async fn an_instance_started_before_its_database_waits_for_it() {
    let db = TestDatabase::create("late").await;
    let mut proxy = Proxy::down(upstream_of(&db.url)).await;
    let proxied_url = via_port(&db.url, proxy.port);
    let database_comes_up = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        proxy.restore().await;
    };
    // `start_captured` returns once the demo listens, which it does only after its
    // database is up; it fails the test if the demo exits meanwhile.
    let ((demo, output), ()) = tokio::join!(
        Instance::start_captured(std::process::Command::new(DEMO), &proxied_url, &[]),
        database_comes_up,
    );
    assert!(
        output.has_line_with(&["waiting for the database", "127.0.0.1"]),
        "the wait is logged: {:#?}",
        output.lines()
    );
    let (status, body, _) = post(&reqwest::Client::new(), &demo, "late-1", 100).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

async fn database_outage_is_503_then_recovers_without_double_execution() {
    let db = TestDatabase::create("outage").await;
    let mut proxy = Proxy::start(upstream_of(&db.url)).await;
    let proxied_url = via_port(&db.url, proxy.port);
    let demo = Instance::start(
        DEMO,
        &proxied_url,
        &["--gateway-latency-ms", "800", "--lease", "2s"],
    )
    .await;
    let client = reqwest::Client::new();

    let (status, first, _) = post(&client, &demo, "before", 100).await;
    assert_eq!(status, StatusCode::CREATED);

    // A request whose handler is at the gateway when the database goes away.
    let in_flight = {
        let (client, url) = (client.clone(), demo.url("/payments"));
        tokio::spawn(async move {
            client
                .post(url)
                .header("authorization", "Bearer sk_test_alice")
                .header("idempotency-key", "in-flight")
                .header("content-type", "application/json")
                .body(r#"{"amount": 300, "currency": "BRL"}"#)
                .send()
                .await
                .map(|response| {
                    let retry_after = response.headers().contains_key("retry-after");
                    (response.status(), retry_after)
                })
        })
    };
    let direct = db.pool().await; // not through the proxy
    process::wait_until("the in-flight request is claimed", || {
        process::claimed(&direct, "in-flight")
    })
    .await;
    proxy.cut(); // while its handler waits on the gateway (800 ms)
    let (in_flight, retry_after) = in_flight.await.unwrap().expect("answered");
    // Whoever notices the outage first (the gateway writing its charge, a step's record,
    // the engine's own store calls), the client is told to retry, not that the server
    // is broken: a stock retrying client stops at a `500`.
    assert_eq!(
        (in_flight, retry_after),
        (StatusCode::SERVICE_UNAVAILABLE, true),
        "its charge could not be recorded: an outage, retried"
    );
    let (status, problem, _) = post(&client, &demo, "during", 200).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "during: {problem}");
    assert_eq!(problem["code"], "idempotency_store_unavailable");
    // A key this instance completed: replayed unchanged from its replay cache while the
    // entry is younger than the cache's maximum age (10 s), else `503` like any request
    // that needs the store; never run again, never answered differently.
    let (status, answer, replayed) = post(&client, &demo, "before", 100).await;
    match status {
        StatusCode::CREATED => {
            assert!(replayed, "a completed key is only ever replayed: {answer}");
            assert_eq!(answer, first);
        }
        StatusCode::SERVICE_UNAVAILABLE => {
            assert_eq!(answer["code"], "idempotency_store_unavailable");
        }
        other => panic!("a completed key during the outage answered {other}: {answer}"),
    }

    proxy.restore().await;
    let mut recovered = None;
    for _ in 0..120 {
        let (status, body, replayed) = post(&client, &demo, "during", 200).await;
        if status == StatusCode::CREATED {
            recovered = Some((body, replayed));
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (_, replayed) = recovered.expect("the app recovered without a restart");
    assert!(
        !replayed,
        "the request refused during the outage ran now, for the first time"
    );
    // The request cut off mid-flight runs again once its claim frees, exactly once.
    let mut retried = None;
    for _ in 0..120 {
        let (status, _, replayed) = post(&client, &demo, "in-flight", 300).await;
        if status != StatusCode::CONFLICT {
            retried = Some((status, replayed));
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(retried, Some((StatusCode::CREATED, false)));
    let (status, again, replayed) = post(&client, &demo, "before", 100).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    assert_eq!(again, first);

    let pool = db.pool().await;
    let per_key: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT amount, COUNT(*) FROM demo_gateway_calls GROUP BY amount ORDER BY amount",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        per_key,
        vec![(100, 1), (200, 1), (300, 1)],
        "each operation charged exactly once"
    );
    pool.close().await;
}
