//! The middleware and the layer against real HTTP servers on loopback: which calls are
//! retried, with which key, after how long, and when they stop. Each server answers from a
//! script and records every request it gets, with the time it arrived.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::Full;
use idempotent_client::{
    CallKey, ClientError, ResponseExt, RetryLayer, RetryMiddleware, RetryPolicy,
};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use tokio::net::TcpListener;
use tower::ServiceExt;

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    at: Instant,
    key: Option<HeaderValue>,
    body: Bytes,
}

/// One scripted answer: a status and its headers.
type ScriptedAnswer = (u16, Vec<(&'static str, String)>);

/// A server that answers the scripted responses in order (the last one forever) and
/// records the requests; it knows nothing of idempotency.
#[derive(Clone)]
struct ScriptedServer {
    script: Arc<Vec<ScriptedAnswer>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl ScriptedServer {
    async fn start(script: Vec<ScriptedAnswer>) -> (Self, SocketAddr) {
        let server = Self {
            script: Arc::new(script),
            seen: Arc::default(),
        };
        let app = Router::new().fallback(answer).with_state(server.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        (server, addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }
}

async fn answer(State(server): State<ScriptedServer>, headers: HeaderMap, body: Bytes) -> Response {
    let n = {
        let mut seen = server.seen.lock().expect("lock");
        seen.push(Seen {
            at: Instant::now(),
            key: headers.get("idempotency-key").cloned(),
            body,
        });
        seen.len() - 1
    };
    let (status, headers) = &server.script[n.min(server.script.len() - 1)];
    let mut response = StatusCode::from_u16(*status)
        .expect("status")
        .into_response();
    for (name, value) in headers {
        response
            .headers_mut()
            .insert(*name, HeaderValue::from_str(value).expect("value"));
    }
    response
}

fn status(code: u16) -> ScriptedAnswer {
    (code, Vec::new())
}

fn status_with(code: u16, name: &'static str, value: &str) -> ScriptedAnswer {
    (code, vec![(name, value.to_owned())])
}

/// A policy whose backoff is short, so a test that sees a long gap knows it came from
/// `Retry-After`.
fn quick_policy() -> RetryPolicy {
    RetryPolicy::default()
        .with_max_attempts(6)
        .with_backoff(Duration::from_millis(1), Duration::from_millis(5))
        .with_deadline(Duration::from_secs(30))
}

/// `POST /payments` on `addr` through `client`, with `key` as the call's key if any.
async fn post_payment(
    client: &ClientWithMiddleware,
    addr: SocketAddr,
    key: Option<CallKey>,
    body: impl Into<reqwest::Body>,
) -> reqwest_middleware::Result<reqwest::Response> {
    let mut request = client.post(format!("http://{addr}/payments")).body(body);
    if let Some(key) = key {
        request = request.with_extension(key);
    }
    request.send().await
}

/// One call with a new key and no body through a client with `policy`.
async fn keyed_call(
    policy: RetryPolicy,
    addr: SocketAddr,
) -> reqwest_middleware::Result<reqwest::Response> {
    let client = client(RetryMiddleware::new(policy));
    post_payment(&client, addr, Some(CallKey::generate()), "").await
}

fn client(middleware: RetryMiddleware) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(middleware)
        .build()
}

#[tokio::test]
async fn a_keyed_post_is_retried_with_the_same_key_until_answered() {
    let (server, addr) =
        ScriptedServer::start(vec![status(503), status(502), status(429), status(201)]).await;
    let key = CallKey::new(r#"order-1042 "quoted""#).unwrap();
    let response = post_payment(
        &client(RetryMiddleware::new(quick_policy())),
        addr,
        Some(key.clone()),
        "amount=10000",
    )
    .await
    .expect("answered");
    assert_eq!(response.status(), 201);
    let report = response.call_report().expect("report");
    assert_eq!(report.attempts, 4);
    assert!(!report.replayed);
    let seen = server.seen();
    assert_eq!(seen.len(), 4);
    for request in &seen {
        assert_eq!(request.key.as_ref(), Some(&key.header_value()));
        assert_eq!(request.key.as_ref().unwrap(), r#""order-1042 \"quoted\"""#);
        assert_eq!(request.body, "amount=10000", "the body is resent whole");
    }
}

#[tokio::test]
async fn a_post_without_a_key_is_sent_once() {
    // A server without idempotency: a second POST would be a second charge.
    let (server, addr) = ScriptedServer::start(vec![status(503), status(503), status(201)]).await;
    let client = client(RetryMiddleware::new(quick_policy()));
    let response = post_payment(&client, addr, None, "amount=10000")
        .await
        .expect("answered");
    assert_eq!(response.status(), 503, "the first answer is final");
    assert_eq!(response.call_report().unwrap().attempts, 1);
    assert_eq!(server.seen().len(), 1);
    assert_eq!(server.seen()[0].key, None);

    // The same request with a key is retried: the rule above is about the key alone.
    let response = post_payment(&client, addr, Some(CallKey::generate()), "amount=10000")
        .await
        .expect("answered");
    assert_eq!(response.status(), 201);
    assert_eq!(server.seen().len(), 3);
}

#[tokio::test]
async fn a_post_without_a_key_whose_connection_drops_is_not_resent() {
    // Reads each request and closes the connection without answering.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(Mutex::new(0u32));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            *counted.lock().unwrap() += 1;
            let mut buf = [0u8; 4096];
            let _ = tokio::io::AsyncReadExt::read(&mut socket, &mut buf).await;
        }
    });
    let client = client(RetryMiddleware::new(quick_policy()));
    let error = post_payment(&client, addr, None, "amount=10000")
        .await
        .expect_err("no answer");
    assert!(error.is_request() || error.is_connect(), "{error:?}");
    assert_eq!(*connections.lock().unwrap(), 1);

    // A keyed one is resent until the attempt budget runs out.
    let error = post_payment(&client, addr, Some(CallKey::generate()), "amount=10000")
        .await
        .expect_err("no answer");
    assert!(error.is_request() || error.is_connect(), "{error:?}");
    assert_eq!(
        *connections.lock().unwrap(),
        1 + quick_policy().max_attempts()
    );
}

#[tokio::test]
async fn a_get_is_retried_without_a_key_and_sent_without_one() {
    let (server, addr) = ScriptedServer::start(vec![status(504), status(200)]).await;
    let response = client(RetryMiddleware::new(quick_policy().with_generated_keys()))
        .get(format!("http://{addr}/payments/pay_1"))
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), 200);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|r| r.key.is_none()), "{seen:?}");
}

#[tokio::test]
async fn other_client_errors_and_server_errors_are_final() {
    for code in [400, 401, 402, 404, 408, 413, 422, 500, 501] {
        let (server, addr) = ScriptedServer::start(vec![status(code), status(201)]).await;
        let response = keyed_call(quick_policy(), addr).await.expect("answered");
        assert_eq!(response.status(), code);
        assert_eq!(server.seen().len(), 1, "{code} is not retried");
    }
}

#[tokio::test]
async fn generated_keys_are_one_per_call() {
    let (server, addr) = ScriptedServer::start(vec![status(409), status(201)]).await;
    let client = client(RetryMiddleware::new(quick_policy().with_generated_keys()));
    for _ in 0..2 {
        let response = post_payment(&client, addr, None, "amount=10000")
            .await
            .expect("answered");
        assert_eq!(response.status(), 201);
    }
    let keys: Vec<String> = server
        .seen()
        .iter()
        .map(|r| r.key.as_ref().expect("keyed").to_str().unwrap().to_owned())
        .collect();
    // Call 1: 409 then 201 with one key; call 2: 201 at once with another.
    assert_eq!(keys.len(), 3);
    assert_eq!(keys[0], keys[1]);
    assert_ne!(keys[1], keys[2]);
    let unquoted = keys[0].trim_matches('"');
    assert_eq!(keys[0], format!("\"{unquoted}\""));
    assert_eq!(unquoted.len(), 36, "a UUID: {unquoted}");
}

#[tokio::test]
async fn a_retry_after_in_seconds_is_waited_for() {
    // The backoff is at most 5 ms: a gap of a second is the server's `Retry-After`.
    let (server, addr) =
        ScriptedServer::start(vec![status_with(409, "retry-after", "1"), status(201)]).await;
    let response = keyed_call(quick_policy(), addr).await.expect("answered");
    assert_eq!(response.status(), 201);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at - seen[0].at;
    assert!(gap >= Duration::from_secs(1), "retried after {gap:?}");
}

#[tokio::test]
async fn a_retry_after_longer_than_the_cap_is_cut_to_the_cap() {
    // An hour is past the deadline: without the cap the call would end on the 503.
    let (server, addr) = ScriptedServer::start(vec![
        status_with(503, "retry-after", "3600"),
        status_with(503, "retry-after", "Fri, 31 Dec 9999 23:59:59 GMT"),
        status(201),
    ])
    .await;
    let policy = quick_policy().with_max_retry_after(Duration::from_millis(150));
    let response = keyed_call(policy, addr).await.expect("answered");
    assert_eq!(response.status(), 201);
    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    for pair in seen.windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(gap >= Duration::from_millis(150), "retried after {gap:?}");
    }
}

#[tokio::test]
async fn the_deadline_ends_a_call_that_keeps_failing() {
    let (server, addr) = ScriptedServer::start(vec![status(503)]).await;
    let deadline = Duration::from_millis(300);
    let policy = RetryPolicy::default()
        .with_max_attempts(u32::MAX)
        .with_backoff(Duration::from_millis(10), Duration::from_millis(40))
        .with_deadline(deadline);
    let answer = keyed_call(policy, addr).await;
    let seen = server.seen();
    assert!(seen.len() > 1, "retried before the deadline");
    // The deadline ends the call between two attempts (the last answer comes back) or
    // during one (that attempt is not waited for); which one is the machine's timing.
    match answer {
        Ok(response) => {
            assert_eq!(response.status(), 503);
            let attempts = response.call_report().unwrap().attempts as usize;
            assert_eq!(attempts, seen.len());
        }
        Err(reqwest_middleware::Error::Middleware(error)) => {
            match error.downcast_ref::<ClientError>() {
                Some(&ClientError::DeadlineExceeded {
                    deadline: passed,
                    attempts,
                }) => {
                    assert_eq!(passed, deadline);
                    // The attempt cut short may not have reached the server.
                    let attempts = attempts as usize;
                    assert!(
                        seen.len() == attempts || seen.len() + 1 == attempts,
                        "{attempts} attempts, {} seen",
                        seen.len()
                    );
                }
                other => panic!("{other:?}"),
            }
        }
        Err(other) => panic!("{other:?}"),
    }
    let span = seen.last().unwrap().at - seen[0].at;
    assert!(
        span < deadline,
        "the last attempt started {span:?} after the first"
    );
}

#[tokio::test]
async fn the_deadline_cuts_an_attempt_that_gets_no_answer() {
    // Accepts and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let policy = quick_policy().with_deadline(Duration::from_millis(200));
    let error = keyed_call(policy, addr).await.expect_err("no answer");
    let error = match error {
        reqwest_middleware::Error::Middleware(error) => error,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        error.downcast_ref::<ClientError>(),
        Some(&ClientError::DeadlineExceeded {
            deadline: Duration::from_millis(200),
            attempts: 1
        })
    );

    // With an attempt timeout shorter than the deadline, timeouts are retried.
    let policy = quick_policy()
        .with_attempt_timeout(Duration::from_millis(50))
        .with_max_attempts(3);
    let error = keyed_call(policy, addr).await.expect_err("no answer");
    let reqwest_middleware::Error::Middleware(error) = error else {
        panic!("{error:?}")
    };
    assert!(
        matches!(
            error.downcast_ref::<ClientError>(),
            Some(ClientError::AttemptTimedOut { attempts: 3, .. })
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_streaming_body_is_refused_when_the_request_may_be_retried() {
    let (server, addr) = ScriptedServer::start(vec![status(201)]).await;
    let client = client(RetryMiddleware::new(quick_policy()));
    let streaming = || reqwest::Body::wrap(Full::new(Bytes::from_static(b"amount=10000")));
    let error = post_payment(&client, addr, Some(CallKey::generate()), streaming())
        .await
        .expect_err("refused");
    let reqwest_middleware::Error::Middleware(error) = error else {
        panic!("{error:?}")
    };
    assert_eq!(
        error.downcast_ref::<ClientError>(),
        Some(&ClientError::BodyNotReplayable)
    );
    assert!(server.seen().is_empty(), "refused before sending");

    // Sent once anyway, it needs no copy.
    let response = post_payment(&client, addr, None, streaming())
        .await
        .expect("answered");
    assert_eq!(response.status(), 201);
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn a_replay_is_reported() {
    let (_server, addr) = ScriptedServer::start(vec![
        status(503),
        status_with(201, "idempotent-replayed", "true"),
    ])
    .await;
    let response = keyed_call(quick_policy(), addr).await.expect("answered");
    assert!(response.is_replayed());
    let report = response.call_report().unwrap();
    assert!(report.replayed);
    assert_eq!(report.attempts, 2);
}

#[tokio::test]
async fn the_tower_layer_applies_the_same_policy_to_a_hyper_client() {
    let (server, addr) = ScriptedServer::start(vec![
        status(409),
        status_with(503, "retry-after", "0"),
        status(201),
    ])
    .await;
    let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let client = tower::ServiceBuilder::new()
        .layer(RetryLayer::new(quick_policy()))
        .service(hyper);
    let key = CallKey::generate();
    let mut request = http::Request::post(format!("http://{addr}/payments"))
        .body(Full::new(Bytes::from_static(b"amount=10000")))
        .unwrap();
    request.extensions_mut().insert(key.clone());
    let response = client.clone().oneshot(request).await.expect("answered");
    assert_eq!(response.status(), 201);
    assert_eq!(response.call_report().unwrap().attempts, 3);
    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|r| r.key == Some(key.header_value())));
    assert!(seen.iter().all(|r| r.body == "amount=10000"));

    // Unkeyed, a POST is sent once.
    let (server, addr) = ScriptedServer::start(vec![status(503), status(201)]).await;
    let request = http::Request::post(format!("http://{addr}/payments"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.oneshot(request).await.expect("answered");
    assert_eq!(response.status(), 503);
    assert_eq!(server.seen().len(), 1);
}
