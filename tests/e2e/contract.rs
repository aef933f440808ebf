//! The contract (the guide's chapter `idempotent_runtime::guide::contract`) end to end,
//! one set of checks run against two apps with the same routes and handler logic: one
//! protected by `#[idempotent]`, one by `IdempotencyLayer` (module `apps`,
//! `contract/apps.rs`). Each check below becomes `attribute::<check>` and
//! `layer::<check>`.

mod apps;

use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use tokio::io::AsyncWriteExt;

use idempotent_runtime::testing::{Trial, async_trial};

use crate::support::{Answer, process, send};
use apps::{BODY_LIMIT, ContractApp, Protection};

const CHARGE: &str = r#"{"amount": 10000, "currency": "BRL"}"#;

/// `POST uri` as `api_key` with `idempotency_key` (a raw header value) and `body`.
fn post(
    uri: &str,
    api_key: &str,
    idempotency_key: Option<&str>,
    body: impl Into<Body>,
) -> Request<Body> {
    let mut request = Request::post(uri)
        .header("authorization", format!("Bearer {api_key}"))
        .header("content-type", "application/json");
    if let Some(key) = idempotency_key {
        request = request.header("idempotency-key", key);
    }
    request.body(body.into()).expect("request")
}

/// `POST /payments` as Alice.
fn pay(key: Option<&str>, body: &str) -> Request<Body> {
    post("/payments", "sk_test_alice", key, body.to_owned())
}

/// Defines each check once, as `async fn check(protection)`, and a test per app.
macro_rules! contract {
    ($(
        $(#[doc = $doc:literal])*
        async fn $name:ident($protection:ident: Protection) $body:block
    )*) => {
        $(
            $(#[doc = $doc])*
            async fn $name($protection: Protection) $body
        )*

        /// Each check on each app, then what only the layer has.
        pub(crate) fn trials() -> Vec<Trial> {
            let mut trials = Vec::new();
            for (app, protection) in [
                ("attribute", Protection::Attribute),
                ("layer", Protection::Layer),
            ] {
                $(
                    trials.push(async_trial(
                        format!("{app}::{}", stringify!($name)),
                        move || $name(protection),
                    ));
                )*
            }
            trials.extend(layer_only::trials());
            trials
        }
    };
}

contract! {
    /// A retry gets the stored status, replayable headers and body; per-response headers
    /// (`Date`, `Set-Cookie`) are not replayed; the handler ran once.
    async fn replay_is_identical_and_runs_once(protection: Protection) {
        let app = ContractApp::new(protection, Duration::ZERO).await;
        let first = send(&app.router, pay(Some("order-1"), CHARGE)).await;
        assert_eq!(first.status, StatusCode::CREATED, "{:?}", String::from_utf8_lossy(&first.body));
        assert!(!first.replayed());
        let id = first.json()["id"].as_str().unwrap().to_owned();
        assert_eq!(first.header("location"), Some(format!("/payments/{id}").as_str()));
        assert_eq!(first.header("date"), Some("Sat, 01 Jan 2000 00:00:00 GMT"));

        let again = send(&app.router, pay(Some("order-1"), CHARGE)).await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
        assert_eq!(again.header("location"), first.header("location"));
        assert_eq!(again.header("content-type"), Some("application/json"));
        assert_eq!(again.header("etag"), Some("\"v1\""));
        assert_eq!(again.header("date"), None, "Date is not stored");
        assert_eq!(again.header("set-cookie"), None, "Set-Cookie is not stored");
        assert_eq!(app.runs(), 1);
    }

    /// The same key with another body is `422 idempotency_key_reused`, also after
    /// replays that the replay cache answered by comparing the request's bytes.
    async fn same_key_with_another_body_is_422(protection: Protection) {
        let app = ContractApp::new(protection, Duration::ZERO).await;
        send(&app.router, pay(Some("order-1"), CHARGE)).await;
        for _ in 0..2 {
            assert!(send(&app.router, pay(Some("order-1"), CHARGE)).await.replayed());
        }
        let other = send(&app.router, pay(Some("order-1"), r#"{"amount": 20000, "currency": "BRL"}"#)).await;
        assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(other.header("content-type"), Some("application/problem+json"));
        assert_eq!(other.code(), "idempotency_key_reused");
        assert!(send(&app.router, pay(Some("order-1"), CHARGE)).await.replayed());
        assert_eq!(app.runs(), 1);
    }

    /// Ten duplicates at once: one runs, the others get `409` + `Retry-After` or a replay.
    async fn concurrent_duplicates_run_once(protection: Protection) {
        let app = ContractApp::new(protection, Duration::from_millis(200)).await;
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(10));
        let tasks: Vec<_> = (0..10)
            .map(|_| {
                let (router, barrier) = (app.router.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    send(&router, pay(Some("order-1"), CHARGE)).await
                })
            })
            .collect();
        let (mut originals, mut conflicts) = (0, 0);
        for task in tasks {
            let answer = task.await.unwrap();
            match answer.status {
                StatusCode::CREATED if answer.replayed() => {}
                StatusCode::CREATED => originals += 1,
                StatusCode::CONFLICT => {
                    conflicts += 1;
                    assert_eq!(answer.code(), "request_in_progress");
                    let retry_after: u64 = answer.header("retry-after").expect("Retry-After").parse().unwrap();
                    assert!(retry_after >= 1);
                }
                other => panic!("unexpected {other}: {:?}", String::from_utf8_lossy(&answer.body)),
            }
        }
        assert_eq!(originals, 1, "exactly one answer is not a replay");
        assert!(conflicts >= 1, "the duplicates overlapped the original");
        assert_eq!(app.runs(), 1, "the handler ran once");
    }

    /// Fifty duplicates at once on a route with `wait`: one runs, the 49 others wait for
    /// it and replay its answer; none gets `409`.
    async fn duplicates_with_wait_replay_instead_of_409(protection: Protection) {
        let app = ContractApp::new(protection, Duration::from_millis(300)).await;
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(50));
        let tasks: Vec<_> = (0..50)
            .map(|_| {
                let (router, barrier) = (app.router.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let request = post("/waiting/payments", "sk_test_alice", Some("order-1"), CHARGE);
                    send(&router, request).await
                })
            })
            .collect();
        let (mut originals, mut replays) = (Vec::new(), Vec::new());
        for task in tasks {
            let answer = task.await.unwrap();
            assert_eq!(answer.status, StatusCode::CREATED, "{:?}", String::from_utf8_lossy(&answer.body));
            if answer.replayed() {
                replays.push(answer.body);
            } else {
                originals.push(answer.body);
            }
        }
        assert_eq!(originals.len(), 1, "exactly one answer is not a replay");
        assert_eq!(replays.len(), 49);
        assert!(replays.iter().all(|body| *body == originals[0]), "every replay is the original's answer");
        assert_eq!(app.runs(), 1, "the handler ran once");
    }

    /// Two callers may use the same key: two runs, two payments.
    async fn keys_are_scoped_per_caller(protection: Protection) {
        let app = ContractApp::new(protection, Duration::ZERO).await;
        let alice = send(&app.router, post("/payments", "sk_test_alice", Some("order-1042"), CHARGE)).await;
        let bob = send(&app.router, post("/payments", "sk_test_bob", Some("order-1042"), CHARGE)).await;
        assert_eq!((alice.status, bob.status), (StatusCode::CREATED, StatusCode::CREATED));
        assert!(!bob.replayed());
        assert_ne!(alice.json()["id"], bob.json()["id"]);
        assert_eq!(bob.json()["owner"], "acct_bob");
        assert_eq!(app.runs(), 2);
    }

    /// Missing, blank, too long, badly quoted and doubled keys are `400` problem+json.
    async fn bad_keys_are_400_before_any_side_effect(protection: Protection) {
        let app = ContractApp::new(protection, Duration::ZERO).await;
        let missing = send(&app.router, pay(None, CHARGE)).await;
        assert_eq!(missing.status, StatusCode::BAD_REQUEST);
        assert_eq!(missing.header("content-type"), Some("application/problem+json"));
        assert_eq!(missing.code(), "idempotency_key_missing");
        for bad in ["", "   ", "\"unterminated", &"k".repeat(256)] {
            let answer = send(&app.router, pay(Some(bad), CHARGE)).await;
            assert_eq!(answer.status, StatusCode::BAD_REQUEST, "key {bad:?}");
            assert_eq!(answer.code(), "idempotency_key_invalid");
        }
        let mut twice = pay(Some("a"), CHARGE);
        twice.headers_mut().append("idempotency-key", "b".parse().unwrap());
        assert_eq!(send(&app.router, twice).await.code(), "idempotency_key_invalid");
        assert_eq!(app.runs(), 0);
    }

    /// Authentication answers first, with or without a key.
    async fn unauthenticated_is_401_with_or_without_a_key(protection: Protection) {
        let app = ContractApp::new(protection, Duration::ZERO).await;
        for key in [Some("k"), None] {
            let anonymous = send(&app.router, post("/payments", "sk_test_mallory", key, CHARGE)).await;
            assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED, "key {key:?}");
            assert_eq!(anonymous.header("content-type"), Some("application/problem+json"));
        }
        assert_eq!(app.runs(), 0);
    }

    /// `"order-7"` and `order-7` are one key.
    async fn quoted_and_bare_keys_are_one_key(protection: Protection) {
        let app = ContractApp::new(protection, Duration::ZERO).await;
        let bare = send(&app.router, pay(Some("order-7"), CHARGE)).await;
        let quoted = send(&app.router, pay(Some("\"order-7\""), CHARGE)).await;
        assert_eq!(bare.status, StatusCode::CREATED);
        assert!(quoted.replayed());
        assert_eq!(quoted.body, bare.body);
        assert_eq!(app.runs(), 1);
    }

    /// 4xx answers are stored and replayed like 2xx.
    async fn validation_400_and_declined_402_are_stored_and_replayed(protection: Protection) {
        let app = ContractApp::new(protection, Duration::ZERO).await;
        let invalid = send_twice(&app, "bad", r#"{"amount": -5, "currency": "BRL"}"#).await;
        assert_eq!(invalid.status, StatusCode::BAD_REQUEST);
        assert_eq!(invalid.code(), "invalid_request");
        let declined = send_twice(&app, "dec", r#"{"amount": 40200, "currency": "BRL"}"#).await;
        assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
        assert_eq!(declined.code(), "card_declined");
        assert_eq!(app.runs(), 2);
    }

    /// A 5xx releases the claim: the retry runs the handler again.
    async fn server_error_releases_the_claim(protection: Protection) {
        let app = ContractApp::new(protection, Duration::ZERO).await;
        let body = r#"{"amount": 50300, "currency": "BRL"}"#;
        for _ in 0..2 {
            let answer = send(&app.router, pay(Some("flaky"), body)).await;
            assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
            assert!(!answer.replayed(), "released: the retry ran the handler again");
            assert_eq!(answer.code(), "gateway_unavailable");
        }
        assert_eq!(app.runs(), 2);
    }

    /// A panic is `500` problem+json and releases the claim.
    async fn a_panic_is_500_problem_and_the_retry_runs_again(protection: Protection) {
        let app = ContractApp::new(protection, Duration::ZERO).await;
        let failed = send(&app.router, post("/panics", "sk_test_alice", Some("k"), "")).await;
        assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(failed.header("content-type"), Some("application/problem+json"));
        let retry = send(&app.router, post("/panics", "sk_test_alice", Some("k"), "")).await;
        assert_eq!(retry.status, StatusCode::CREATED);
        assert!(!retry.replayed());
        assert_eq!(app.runs(), 2);
    }

    /// A body over the `DefaultBodyLimit` is `413` problem+json and claims nothing.
    async fn body_over_the_limit_is_413_and_claims_nothing(protection: Protection) {
        let app = ContractApp::new(protection, Duration::ZERO).await;
        let big = format!(r#"{{"amount": 1, "currency": "{}"}}"#, "x".repeat(BODY_LIMIT));
        let refused = send(&app.router, pay(Some("k"), &big)).await;
        assert_eq!(refused.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(refused.header("content-type"), Some("application/problem+json"));
        let ok = send(&app.router, pay(Some("k"), CHARGE)).await;
        assert_eq!(ok.status, StatusCode::CREATED);
        assert!(!ok.replayed(), "the refused request stored nothing under the key");
        assert_eq!(app.runs(), 1);
    }

    /// Behind `Router::nest` the fingerprint has the full path: another account's
    /// resource under the same key is another request.
    async fn nested_routes_fingerprint_the_full_path(protection: Protection) {
        let app = ContractApp::new(protection, Duration::ZERO).await;
        let first = send(&app.router, post("/accounts/A/transfers", "sk_test_alice", Some("k"), CHARGE)).await;
        assert_eq!(first.status, StatusCode::CREATED);
        let replay = send(&app.router, post("/accounts/A/transfers", "sk_test_alice", Some("k"), CHARGE)).await;
        assert!(replay.replayed());
        let other = send(&app.router, post("/accounts/B/transfers", "sk_test_alice", Some("k"), CHARGE)).await;
        assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY, "not a replay");
        assert_eq!(app.runs(), 1);
    }

    /// Past its TTL a key is new: the handler runs again, for another request too.
    async fn an_expired_key_runs_as_new(protection: Protection) {
        let app = ContractApp::new(protection, Duration::ZERO).await;
        let first = send(&app.router, pay(Some("reused"), CHARGE)).await;
        assert_eq!(first.status, StatusCode::CREATED);
        app.clock.advance(Duration::from_secs(24 * 3600 + 1)); // past the default TTL
        let other = r#"{"amount": 777, "currency": "BRL"}"#;
        let second = send(&app.router, pay(Some("reused"), other)).await;
        assert_eq!(second.status, StatusCode::CREATED);
        assert!(!second.replayed(), "expired: treated as new");
        assert_eq!(second.json()["amount"], 777);
        assert_ne!(second.json()["id"], first.json()["id"]);
        assert_eq!(app.runs(), 2);
    }

    /// A client that hangs up mid-request cancels nothing: the retry gets the replay.
    async fn client_hanging_up_mid_request_still_records_the_outcome(protection: Protection) {
        let app = ContractApp::new(protection, Duration::from_millis(400)).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = app.router.clone();
        let server = tokio::spawn(async move { axum::serve(listener, router).await });

        let raw = format!(
            "POST /payments HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer sk_test_alice\r\n\
             idempotency-key: hangup-1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{CHARGE}",
            CHARGE.len()
        );
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        socket.write_all(raw.as_bytes()).await.unwrap();
        process::wait_until("the request is claimed", || process::claimed(&app.records, "hangup-1")).await;
        drop(socket); // hang up while the handler (400 ms) runs

        let client = reqwest::Client::new();
        let mut replayed = None;
        for _ in 0..100 {
            let response = client
                .post(format!("http://{addr}/payments"))
                .header("authorization", "Bearer sk_test_alice")
                .header("idempotency-key", "hangup-1")
                .header("content-type", "application/json")
                .body(CHARGE)
                .send()
                .await
                .unwrap();
            if response.status() == StatusCode::CONFLICT {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            replayed = Some(response);
            break;
        }
        let replayed = replayed.expect("the original finished");
        assert_eq!(replayed.status(), StatusCode::CREATED);
        assert_eq!(replayed.headers()["idempotent-replayed"], "true");
        assert_eq!(app.runs(), 1, "ran exactly once");
        server.abort();
    }

    /// A client that hangs up before the claim (here while its body is still coming) ran
    /// nothing and left nothing: the retry is a fresh run, not a `409` or a replay.
    async fn client_hanging_up_before_the_claim_leaves_the_key_free(protection: Protection) {
        let app = ContractApp::new(protection, Duration::ZERO).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = app.router.clone();
        let server = tokio::spawn(async move { axum::serve(listener, router).await });

        // The head announces the whole body; half of it is sent, then the socket closes.
        let raw = format!(
            "POST /payments HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer sk_test_alice\r\n\
             idempotency-key: early-1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{}",
            CHARGE.len(),
            &CHARGE[..CHARGE.len() / 2]
        );
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        socket.write_all(raw.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await; // the server reads what came
        drop(socket);
        tokio::time::sleep(Duration::from_millis(200)).await; // and sees the hang-up
        assert!(!process::claimed(&app.records, "early-1").await, "nothing claimed");
        assert_eq!(app.runs(), 0);

        let retry = send(&app.router, pay(Some("early-1"), CHARGE)).await;
        assert_eq!(retry.status, StatusCode::CREATED, "{:?}", String::from_utf8_lossy(&retry.body));
        assert!(!retry.replayed(), "a fresh run");
        assert_eq!(app.runs(), 1, "ran exactly once");
        server.abort();
    }

    /// No header is fingerprinted, `Content-Type` and its parameters included: a retry
    /// that labels the same body differently is the same request. The handler's `Json`
    /// extractor still reads the header: the attribute runs it before the claim (a type
    /// it refuses is its `415`), the layer looks the key up first (the replay).
    async fn content_type_is_not_fingerprinted(protection: Protection) {
        let app = ContractApp::new(protection, Duration::ZERO).await;
        let first = send(&app.router, pay(Some("ctype-1"), CHARGE)).await;
        assert_eq!(first.status, StatusCode::CREATED);
        let labelled = |content_type: &str| {
            Request::post("/payments")
                .header("authorization", "Bearer sk_test_alice")
                .header("idempotency-key", "ctype-1")
                .header("content-type", content_type)
                .body(Body::from(CHARGE))
                .expect("request")
        };
        let charset = send(&app.router, labelled("application/json; charset=utf-8")).await;
        assert_eq!(charset.status, StatusCode::CREATED);
        assert!(charset.replayed(), "parameters are not fingerprinted");
        assert_eq!(charset.body, first.body);

        let text = send(&app.router, labelled("text/plain")).await;
        match protection {
            Protection::Attribute => {
                assert_eq!(text.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
                assert!(!text.replayed());
            }
            Protection::Layer => {
                assert_eq!(text.status, StatusCode::CREATED);
                assert!(text.replayed(), "the key is looked up before the handler's extractors");
            }
        }
        assert_eq!(app.runs(), 1);
    }

    /// `key = optional` / `.key_optional()`: without a key the handler runs every time,
    /// unprotected; a malformed key is still `400`; a key is protected as usual.
    async fn optional_key_runs_unprotected_without_one(protection: Protection) {
        let app = ContractApp::new(protection, Duration::ZERO).await;
        let optional = |key: Option<&str>| post("/optional/payments", "sk_test_alice", key, CHARGE);
        let first = send(&app.router, optional(None)).await;
        let second = send(&app.router, optional(None)).await;
        for (answer, run) in [(&first, 1), (&second, 2)] {
            assert_eq!(answer.status, StatusCode::CREATED, "{:?}", String::from_utf8_lossy(&answer.body));
            assert!(!answer.replayed());
            assert_eq!(answer.json()["run"], run);
        }
        assert_eq!(app.runs(), 2, "no key: two requests, two runs");

        for bad in ["", "\"unterminated", &"k".repeat(256)] {
            let answer = send(&app.router, optional(Some(bad))).await;
            assert_eq!(answer.status, StatusCode::BAD_REQUEST, "key {bad:?}");
            assert_eq!(answer.code(), "idempotency_key_invalid");
        }
        assert_eq!(app.runs(), 2, "a malformed key runs nothing");

        let keyed = send(&app.router, optional(Some("opt-1"))).await;
        let replay = send(&app.router, optional(Some("opt-1"))).await;
        assert_eq!(keyed.status, StatusCode::CREATED);
        assert!(!keyed.replayed());
        assert!(replay.replayed());
        assert_eq!(replay.body, keyed.body);
        assert!(keyed.json()["id"].as_str().unwrap().starts_with("pay_"));
        assert_eq!(app.runs(), 3, "with a key: one run, one replay");

        // The required route still refuses a request without a key.
        assert_eq!(send(&app.router, pay(None, CHARGE)).await.status, StatusCode::BAD_REQUEST);
    }
}

/// Sends the same request twice under `key`; asserts the second is a byte-identical
/// replay of the first, and returns the first.
async fn send_twice(app: &ContractApp, key: &str, body: &str) -> Answer {
    let first = send(&app.router, pay(Some(key), body)).await;
    let again = send(&app.router, pay(Some(key), body)).await;
    assert!(!first.replayed());
    assert!(again.replayed(), "the second answer is a replay");
    assert_eq!((again.status, &again.body), (first.status, &first.body));
    first
}

/// What only the layer has: its own scope source, methods, and body reading.
mod layer_only {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::body::{Body, Bytes};
    use axum::extract::{Json, State};
    use axum::routing::post;
    use axum::{Extension, Router};
    use http::{Method, Request, StatusCode};
    use idempotent_runtime::layer::IdempotencyLayer;
    use idempotent_runtime::store::MemoryStore;
    use idempotent_runtime::testing::{Trial, async_trial};
    use idempotent_runtime::{Idempotency, IdempotencyKey};

    use crate::support::send;

    pub(super) fn trials() -> Vec<Trial> {
        vec![
            async_trial(
                "layer_only::a_missing_scope_is_500_and_runs_nothing",
                a_missing_scope_is_500_and_runs_nothing,
            ),
            async_trial(
                "layer_only::scopes_from_a_function_separate_callers_and_the_handler_gets_the_key",
                scopes_from_a_function_separate_callers_and_the_handler_gets_the_key,
            ),
            async_trial(
                "layer_only::other_methods_pass_straight_through",
                other_methods_pass_straight_through,
            ),
            async_trial(
                "layer_only::a_tower_http_body_limit_is_413_problem_and_claims_nothing",
                a_tower_http_body_limit_is_413_problem_and_claims_nothing,
            ),
            async_trial(
                "layer_only::extractor_rejections_behind_the_layer_are_the_handlers_answer",
                extractor_rejections_behind_the_layer_are_the_handlers_answer,
            ),
            async_trial(
                "layer_only::extractor_rejections_through_as_problem_release_the_key_behind_the_layer",
                extractor_rejections_through_as_problem_release_the_key_behind_the_layer,
            ),
        ]
    }

    /// Counts its runs and echoes the key it was handed.
    async fn counted(
        State(runs): State<Arc<AtomicUsize>>,
        key: Option<Extension<IdempotencyKey>>,
    ) -> (StatusCode, String) {
        runs.fetch_add(1, Ordering::SeqCst);
        let key = key.map_or_else(
            || "none".to_owned(),
            |Extension(key)| key.as_str().to_owned(),
        );
        (StatusCode::CREATED, key)
    }

    fn request(
        method: Method,
        key: Option<&str>,
        account: Option<&str>,
        body: impl Into<Body>,
    ) -> Request<Body> {
        let mut request = Request::builder().method(method).uri("/things");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        if let Some(account) = account {
            request = request.header("x-account", account);
        }
        request.body(body.into()).unwrap()
    }

    fn app(
        layer: impl FnOnce(IdempotencyLayer<idempotent_runtime::layer::NoScope>) -> IdempotencyLayer,
    ) -> (Router, Arc<AtomicUsize>) {
        let runs = Arc::new(AtomicUsize::new(0));
        let layer = layer(IdempotencyLayer::new(Idempotency::new(MemoryStore::new())));
        let router = Router::new()
            .route("/things", post(counted).put(counted).get(counted))
            .route_layer(layer)
            .with_state(runs.clone());
        (router, runs)
    }

    /// For these tests only: the scope is a header the test sets (a real app reads what
    /// its authentication established).
    fn account_header(
        layer: IdempotencyLayer<idempotent_runtime::layer::NoScope>,
    ) -> IdempotencyLayer {
        layer.scope_with(|parts| {
            parts
                .headers
                .get("x-account")
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        })
    }

    async fn a_missing_scope_is_500_and_runs_nothing() {
        #[derive(Clone)]
        struct Caller(String);
        impl idempotent_runtime::Scope for Caller {
            fn scope(&self) -> std::borrow::Cow<'_, str> {
                self.0.as_str().into()
            }
        }
        // No authentication layer inserts `Caller`: a misconfiguration.
        let (router, runs) = app(|layer| layer.scope_from_extension::<Caller>());
        let answer = send(&router, request(Method::POST, Some("k"), None, "")).await;
        assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            answer.header("content-type"),
            Some("application/problem+json")
        );
        assert_eq!(answer.code(), "idempotency_scope_missing");
        // The same from a scope function that finds none.
        let (router, _) = app(account_header);
        let answer = send(&router, request(Method::POST, Some("k"), None, "")).await;
        assert_eq!(answer.code(), "idempotency_scope_missing");
        // An empty scope is refused like the attribute's.
        let answer = send(&router, request(Method::POST, Some("k"), Some(""), "")).await;
        assert_eq!(answer.code(), "idempotency_scope_empty");
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }

    async fn scopes_from_a_function_separate_callers_and_the_handler_gets_the_key() {
        let (router, runs) = app(account_header);
        let alice = send(&router, request(Method::POST, Some("k"), Some("alice"), "")).await;
        let bob = send(&router, request(Method::POST, Some("k"), Some("bob"), "")).await;
        let alice_again = send(&router, request(Method::POST, Some("k"), Some("alice"), "")).await;
        assert_eq!(
            (alice.status, bob.status),
            (StatusCode::CREATED, StatusCode::CREATED)
        );
        assert_eq!(
            alice.body, b"k",
            "the handler finds the claimed key as an extension"
        );
        assert!(!bob.replayed());
        assert!(alice_again.replayed());
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    async fn other_methods_pass_straight_through() {
        let (router, runs) = app(account_header);
        // GET and PUT are not protected by default: no key needed, nothing replayed.
        for method in [Method::GET, Method::PUT, Method::PUT] {
            let answer = send(&router, request(method.clone(), None, None, "")).await;
            assert_eq!(answer.status, StatusCode::CREATED, "{method}");
            assert!(!answer.replayed());
        }
        assert_eq!(runs.load(Ordering::SeqCst), 3);

        let (router, runs) = app(|layer| account_header(layer).methods([Method::PUT]));
        let put = request(Method::PUT, None, Some("alice"), "");
        assert_eq!(send(&router, put).await.code(), "idempotency_key_missing");
        let post = send(&router, request(Method::POST, None, Some("alice"), "")).await;
        assert_eq!(
            post.status,
            StatusCode::CREATED,
            "POST is no longer protected"
        );
        for _ in 0..2 {
            send(&router, request(Method::PUT, Some("p"), Some("alice"), "")).await;
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "one POST, one PUT and its replay"
        );
    }

    async fn a_tower_http_body_limit_is_413_problem_and_claims_nothing() {
        let runs = Arc::new(AtomicUsize::new(0));
        let router = Router::new()
            .route("/things", post(counted))
            .route_layer(account_header(IdempotencyLayer::new(Idempotency::new(
                MemoryStore::new(),
            ))))
            .layer(tower_http::limit::RequestBodyLimitLayer::new(16))
            .with_state(runs.clone());
        // Chunked (no Content-Length): the limit strikes while the layer reads the body.
        let chunks = futures_util::stream::iter(
            ["0123456789", "0123456789"].map(|chunk| Ok::<_, std::io::Error>(Bytes::from(chunk))),
        );
        let refused = send(
            &router,
            request(
                Method::POST,
                Some("k"),
                Some("alice"),
                Body::from_stream(chunks),
            ),
        )
        .await;
        assert_eq!(refused.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(
            refused.header("content-type"),
            Some("application/problem+json")
        );
        let small = send(
            &router,
            request(Method::POST, Some("k"), Some("alice"), "small"),
        )
        .await;
        assert_eq!(small.status, StatusCode::CREATED);
        assert!(!small.replayed(), "the refused request claimed nothing");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    /// Unlike the attribute, which extracts everything before it claims, the layer cannot
    /// see the handler's extractors: their rejections are the handler's answer, stored and
    /// replayed like any 4xx.
    async fn extractor_rejections_behind_the_layer_are_the_handlers_answer() {
        async fn json(Json(value): Json<serde_json::Value>) -> String {
            value.to_string()
        }
        let router = Router::new()
            .route("/things", post(json))
            .route_layer(account_header(IdempotencyLayer::new(Idempotency::new(
                MemoryStore::new(),
            ))));
        let bad = || {
            let mut request = request(Method::POST, Some("k"), Some("alice"), "{not json");
            request
                .headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            request
        };
        let first = send(&router, bad()).await;
        assert_eq!(first.status, StatusCode::BAD_REQUEST);
        let again = send(&router, bad()).await;
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
    }

    /// Wrapped in `AsProblem`, an extractor's rejection behind the layer is not recorded:
    /// the key is released, so the corrected request runs under the same key — as with
    /// the attribute.
    async fn extractor_rejections_through_as_problem_release_the_key_behind_the_layer() {
        async fn json(
            idempotent_runtime::AsProblem(Json(value)): idempotent_runtime::AsProblem<
                Json<serde_json::Value>,
            >,
        ) -> String {
            value.to_string()
        }
        let router = Router::new()
            .route("/things", post(json))
            .route_layer(account_header(IdempotencyLayer::new(Idempotency::new(
                MemoryStore::new(),
            ))));
        let with_body = |body: &'static str| {
            let mut request = request(Method::POST, Some("k"), Some("alice"), body);
            request
                .headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            request
        };
        let refused = send(&router, with_body("{not json")).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            refused.header("content-type"),
            Some("application/problem+json")
        );
        let fixed = send(&router, with_body(r#"{"a":1}"#)).await;
        assert_eq!(
            fixed.status,
            StatusCode::OK,
            "not 422: nothing was recorded"
        );
        assert!(!fixed.replayed());
    }
}
