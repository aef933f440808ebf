//! The contract (README, "The contract") end to end, through the payments example on a
//! real SQLite file.

mod support;

use std::time::Duration;

use http::StatusCode;
use support::{payments_app, post_payment, send};

const CHARGE: &str = r#"{"amount": 10000, "currency": "BRL"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_is_identical_and_does_not_charge_again() {
    let dir = tempfile::tempdir().unwrap();
    let (app, gateway) = payments_app(dir.path(), Duration::ZERO).await;

    let first = send(&app, post_payment("sk_test_alice", Some("order-1"), CHARGE)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    let id = first.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(
        first.header("location"),
        Some(format!("/payments/{id}").as_str())
    );

    let second = send(&app, post_payment("sk_test_alice", Some("order-1"), CHARGE)).await;
    assert_eq!(second.status, StatusCode::CREATED);
    assert!(second.replayed());
    assert_eq!(second.body, first.body);
    assert_eq!(second.header("location"), first.header("location"));
    assert_eq!(second.header("content-type"), Some("application/json"));
    assert_eq!(gateway.calls().await.unwrap(), 1, "one charge");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_with_another_body_is_422() {
    let dir = tempfile::tempdir().unwrap();
    let (app, gateway) = payments_app(dir.path(), Duration::ZERO).await;
    send(&app, post_payment("sk_test_alice", Some("order-1"), CHARGE)).await;
    let other = send(
        &app,
        post_payment(
            "sk_test_alice",
            Some("order-1"),
            r#"{"amount": 20000, "currency": "BRL"}"#,
        ),
    )
    .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        other.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(other.code(), "idempotency_key_reused");
    assert_eq!(gateway.calls().await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_charge_once() {
    let dir = tempfile::tempdir().unwrap();
    let (app, gateway) = payments_app(dir.path(), Duration::from_millis(200)).await;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(10));
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let (app, barrier) = (app.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                send(&app, post_payment("sk_test_alice", Some("order-1"), CHARGE)).await
            })
        })
        .collect();
    let (mut originals, mut replays) = (0, 0);
    for task in tasks {
        let answer = task.await.unwrap();
        match answer.status {
            StatusCode::CREATED if answer.replayed() => replays += 1,
            StatusCode::CREATED => originals += 1,
            StatusCode::CONFLICT => {
                assert_eq!(answer.code(), "request_in_progress");
                let retry_after: u64 = answer
                    .header("retry-after")
                    .expect("Retry-After")
                    .parse()
                    .unwrap();
                assert!(retry_after >= 1);
            }
            other => panic!(
                "unexpected {other}: {:?}",
                String::from_utf8_lossy(&answer.body)
            ),
        }
    }
    assert_eq!(
        originals, 1,
        "exactly one answer is not a replay ({replays} replays)"
    );
    assert_eq!(
        gateway.calls().await.unwrap(),
        1,
        "the handler charged once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_scoped_per_caller() {
    let dir = tempfile::tempdir().unwrap();
    let (app, gateway) = payments_app(dir.path(), Duration::ZERO).await;
    let alice = send(
        &app,
        post_payment("sk_test_alice", Some("order-1042"), CHARGE),
    )
    .await;
    let bob = send(
        &app,
        post_payment("sk_test_bob", Some("order-1042"), CHARGE),
    )
    .await;
    assert_eq!(
        (alice.status, bob.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!bob.replayed());
    assert_ne!(alice.json()["id"], bob.json()["id"]);
    assert_eq!(gateway.calls().await.unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_are_400_before_any_side_effect() {
    let dir = tempfile::tempdir().unwrap();
    let (app, gateway) = payments_app(dir.path(), Duration::ZERO).await;
    let missing = send(&app, post_payment("sk_test_alice", None, CHARGE)).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(missing.code(), "idempotency_key_missing");
    for bad in ["", "   ", "\"unterminated", &"k".repeat(256)] {
        let answer = send(&app, post_payment("sk_test_alice", Some(bad), CHARGE)).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "key {bad:?}");
        assert_eq!(answer.code(), "idempotency_key_invalid");
    }
    let mut twice = post_payment("sk_test_alice", Some("a"), CHARGE);
    twice
        .headers_mut()
        .append("idempotency-key", "b".parse().unwrap());
    assert_eq!(send(&app, twice).await.code(), "idempotency_key_invalid");
    assert_eq!(gateway.calls().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_is_401_and_bad_json_is_rejected_without_claiming() {
    let dir = tempfile::tempdir().unwrap();
    let (app, gateway) = payments_app(dir.path(), Duration::ZERO).await;
    let anonymous = send(&app, post_payment("sk_test_mallory", Some("k"), CHARGE)).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        anonymous.header("content-type"),
        Some("application/problem+json")
    );
    let garbage = send(&app, post_payment("sk_test_alice", Some("k"), "{not json")).await;
    assert_eq!(garbage.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        garbage.header("content-type"),
        Some("application/problem+json"),
        "the JSON extractor's rejection is a problem like every other error"
    );
    assert_eq!(garbage.code(), "bad_request");
    let detail = garbage.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.starts_with("Failed to parse the request body as JSON"),
        "{detail}"
    );
    // Nothing was stored: the same key now works with a good body.
    let good = send(&app, post_payment("sk_test_alice", Some("k"), CHARGE)).await;
    assert_eq!(good.status, StatusCode::CREATED);
    assert!(!good.replayed());
    assert_eq!(gateway.calls().await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_without_key_is_401() {
    let dir = tempfile::tempdir().unwrap();
    let (app, gateway) = payments_app(dir.path(), Duration::ZERO).await;
    // Authentication answers first: the missing key is not revealed to an unknown caller.
    let anonymous = send(&app, post_payment("sk_test_mallory", None, CHARGE)).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        anonymous.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(gateway.calls().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quoted_and_bare_keys_are_one_key() {
    let dir = tempfile::tempdir().unwrap();
    let (app, gateway) = payments_app(dir.path(), Duration::ZERO).await;
    let bare = send(&app, post_payment("sk_test_alice", Some("order-7"), CHARGE)).await;
    let quoted = send(
        &app,
        post_payment("sk_test_alice", Some("\"order-7\""), CHARGE),
    )
    .await;
    assert_eq!(bare.status, StatusCode::CREATED);
    assert!(quoted.replayed());
    assert_eq!(quoted.body, bare.body);
    assert_eq!(gateway.calls().await.unwrap(), 1);
}

/// Sends the same charge twice under `key`; asserts the second is a byte-identical
/// replay of the first, and returns the first.
async fn send_twice(app: &axum::Router, key: &str, body: &str) -> support::Answer {
    let first = send(app, post_payment("sk_test_alice", Some(key), body)).await;
    let again = send(app, post_payment("sk_test_alice", Some(key), body)).await;
    assert!(!first.replayed());
    assert!(again.replayed(), "the second answer is a replay");
    assert_eq!((again.status, &again.body), (first.status, &first.body));
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_400_and_declined_402_are_stored_and_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let (app, gateway) = payments_app(dir.path(), Duration::ZERO).await;
    let invalid = send_twice(&app, "bad", r#"{"amount": -5, "currency": "brl"}"#).await;
    assert_eq!(invalid.status, StatusCode::BAD_REQUEST);
    assert_eq!(invalid.code(), "invalid_request");
    assert_eq!(
        invalid.json()["detail"],
        "Amount must be a positive integer in minor units, e.g. 10000."
    );

    let declined = send_twice(&app, "dec", r#"{"amount": 40200, "currency": "BRL"}"#).await;
    assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(declined.code(), "card_declined");
    assert_eq!(
        declined.json()["reason"],
        "generic_decline",
        "a machine code"
    );
    let charges = gateway.all().await.unwrap();
    assert_eq!(charges.len(), 1, "the declined charge is recorded once");
    assert_eq!(charges[0].status, "declined");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_503_releases_the_claim() {
    let dir = tempfile::tempdir().unwrap();
    let (app, gateway) = payments_app(dir.path(), Duration::ZERO).await;
    let body = r#"{"amount": 50300, "currency": "BRL"}"#;
    for _ in 0..2 {
        let answer = send(&app, post_payment("sk_test_alice", Some("flaky"), body)).await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            !answer.replayed(),
            "released: the retry ran the handler again"
        );
        assert_eq!(answer.code(), "gateway_unavailable");
    }
    assert_eq!(gateway.calls().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_survive_a_restart_on_the_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let first_body = {
        let (app, _) = payments_app(dir.path(), Duration::ZERO).await;
        send(&app, post_payment("sk_test_alice", Some("order-1"), CHARGE))
            .await
            .body
    };
    let (app, gateway) = payments_app(dir.path(), Duration::ZERO).await;
    let after_restart = send(&app, post_payment("sk_test_alice", Some("order-1"), CHARGE)).await;
    assert!(after_restart.replayed());
    assert_eq!(after_restart.body, first_body);
    assert_eq!(gateway.calls().await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_and_fetching_payments() {
    let dir = tempfile::tempdir().unwrap();
    let (app, _) = payments_app(dir.path(), Duration::ZERO).await;
    let created = send(&app, post_payment("sk_test_alice", Some("order-1"), CHARGE)).await;
    let location = created.header("location").unwrap().to_owned();
    let get = |uri: &str, key: &str| {
        http::Request::get(uri)
            .header("authorization", format!("Bearer {key}"))
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let one = send(&app, get(&location, "sk_test_alice")).await;
    assert_eq!(one.status, StatusCode::OK);
    assert_eq!(one.body, created.body);
    assert_eq!(
        send(&app, get(&location, "sk_test_bob")).await.status,
        StatusCode::NOT_FOUND
    );
    let list = send(&app, get("/payments", "sk_test_alice")).await.json();
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(
        send(&app, get("/payments", "sk_test_bob")).await.json(),
        serde_json::json!([])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_key_runs_as_new() {
    let dir = tempfile::tempdir().unwrap();
    let clock = idempotent_runtime::ManualClock::new();
    let (app, gateway) =
        support::payments_app_on_clock(dir.path(), Duration::ZERO, clock.clone()).await;
    let first = send(&app, post_payment("sk_test_alice", Some("reused"), CHARGE)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    clock.advance(Duration::from_secs(24 * 3600 + 1)); // past the default TTL

    // The same key for another operation after its TTL: a new request, a new charge
    // (its derived downstream key differs, so the gateway does not answer with the old one).
    let other = r#"{"amount": 777, "currency": "BRL"}"#;
    let second = send(&app, post_payment("sk_test_alice", Some("reused"), other)).await;
    assert_eq!(second.status, StatusCode::CREATED);
    assert!(!second.replayed(), "expired: treated as new");
    assert_eq!(second.json()["amount"], 777);
    assert_ne!(second.json()["id"], first.json()["id"]);
    assert_eq!(gateway.calls().await.unwrap(), 2);
    assert_eq!(gateway.all().await.unwrap().len(), 2, "two charges");
}
