//! The payments example end to end on a real SQLite file: what the demo adds to the
//! contract (its gateway, its problem+json for bad JSON, its records across a restart,
//! its read endpoints). The contract itself is checked in `tests/contract.rs`, through
//! the attribute and through `IdempotencyLayer`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::StatusCode;
use idempotent_demo::gateway::KeyHandling;
use idempotent_demo::gateway::api::GatewayClient;
use idempotent_demo::payments::{Authorise, DEMO_WEBHOOK_SECRET};
use idempotent_runtime::store::{FencingToken, Forward, RecordedStep, Store, StoreError};
use idempotent_runtime::testing::{Trial, async_trial};
use idempotent_runtime::webhook::WebhookSecret;

use crate::support::{
    self, DemoVariant, payments_app, payments_demo, payments_demo_with, post_payment, send,
};

const CHARGE: &str = r#"{"amount": 10000, "currency": "BRL"}"#;

pub(crate) fn trials() -> Vec<Trial> {
    vec![
        async_trial(
            "unauthenticated_is_401_and_bad_json_is_rejected_without_claiming",
            unauthenticated_is_401_and_bad_json_is_rejected_without_claiming,
        ),
        async_trial(
            "validation_400_and_declined_402_are_stored_and_replayed",
            validation_400_and_declined_402_are_stored_and_replayed,
        ),
        async_trial(
            "gateway_503_releases_the_claim",
            gateway_503_releases_the_claim,
        ),
        async_trial(
            "records_survive_a_restart_on_the_sqlite_file",
            records_survive_a_restart_on_the_sqlite_file,
        ),
        async_trial(
            "listing_and_fetching_payments",
            listing_and_fetching_payments,
        ),
        async_trial(
            "a_charge_authorises_writes_one_ledger_row_and_mails_one_receipt",
            a_charge_authorises_writes_one_ledger_row_and_mails_one_receipt,
        ),
        async_trial(
            "a_refund_event_delivered_ten_times_mails_one_notice",
            a_refund_event_delivered_ten_times_mails_one_notice,
        ),
        async_trial(
            "a_forged_first_delivery_is_401_and_stores_nothing",
            a_forged_first_delivery_is_401_and_stores_nothing,
        ),
        async_trial(
            "a_charge_whose_record_the_store_lost_is_verified_not_repeated",
            || a_charge_whose_record_the_store_lost(Authorise::AtMostOnce),
        ),
        async_trial(
            "a_charge_whose_record_the_store_lost_is_repeated_at_least_once",
            || a_charge_whose_record_the_store_lost(Authorise::AtLeastOnce),
        ),
    ]
}

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

/// The demo's ledger rows for `payment`.
async fn ledger_rows(ledger: &idempotent_demo::payments::Ledger, payment: &str) -> i64 {
    #[allow(irrefutable_let_patterns)] // a build with SQLite alone
    let idempotent_demo::database::Database::Sqlite(pool) = ledger.database() else {
        panic!("the in-process demo runs on SQLite");
    };
    sqlx::query_scalar("SELECT COUNT(*) FROM demo_payment_ledger WHERE payment_id = $1")
        .bind(payment)
        .fetch_one(pool)
        .await
        .expect("count ledger rows")
}

/// Without a crash the three steps run once each, a replay runs none, and a declined
/// card stops the request at `authorise` (its `402` is recorded, nothing else happens).
async fn a_charge_authorises_writes_one_ledger_row_and_mails_one_receipt() {
    let dir = tempfile::tempdir().unwrap();
    let demo = payments_demo(dir.path(), Duration::ZERO).await;
    let charged = send_twice(&demo.app, "order-1", CHARGE).await;
    assert_eq!(charged.status, StatusCode::CREATED);
    let payment = charged.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(demo.gateway.calls().await.unwrap(), 1);
    assert_eq!(ledger_rows(&demo.ledger, &payment).await, 1);
    assert_eq!(demo.mailer.sent(), 1, "one receipt, none for the replay");

    let declined = send_twice(&demo.app, "dec", r#"{"amount": 40200, "currency": "BRL"}"#).await;
    assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
    let charges = demo.gateway.all().await.unwrap();
    let declined_id = &charges.iter().find(|c| c.status == "declined").unwrap().id;
    assert_eq!(ledger_rows(&demo.ledger, declined_id).await, 0);
    assert_eq!(demo.mailer.sent(), 1, "no receipt for a declined card");
}

/// The gateway's `charge.refunded` event `id`, signed now with `secret`.
fn refund_event(id: &str, secret: &str) -> http::Request<axum::body::Body> {
    let body = r#"{"type":"charge.refunded","data":{"charge":"ch_1","account":"acct_alice"}}"#;
    let timestamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let signature = WebhookSecret::parse(secret)
        .unwrap()
        .sign(id, timestamp, body.as_bytes());
    http::Request::post("/webhooks/gateway")
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(axum::body::Body::from(body))
        .unwrap()
}

/// A refund event delivered ten times, one of them forged: the forgery is `401`, the
/// customer gets one refund notice, and every genuine delivery the same answer.
async fn a_refund_event_delivered_ten_times_mails_one_notice() {
    let dir = tempfile::tempdir().unwrap();
    let demo = payments_demo(dir.path(), Duration::ZERO).await;
    let forged = "whsec_Zm9yZ2VkLWJ5LXNvbWVib2R5LWVsc2U=";
    let first = send(&demo.app, refund_event("evt_1", DEMO_WEBHOOK_SECRET)).await;
    assert_eq!(first.status, StatusCode::OK, "{:?}", first.json());
    for delivery in 2..=10 {
        let secret = if delivery == 5 {
            forged
        } else {
            DEMO_WEBHOOK_SECRET
        };
        let answer = send(&demo.app, refund_event("evt_1", secret)).await;
        if delivery == 5 {
            assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
            assert_eq!(answer.json()["code"], "webhook_unverified");
        } else {
            assert_eq!(answer.status, StatusCode::OK);
            assert_eq!(answer.headers["idempotent-replayed"], "true");
            assert_eq!(answer.body, first.body);
        }
    }
    assert_eq!(
        demo.mailer.sent(),
        1,
        "one refund notice for ten deliveries"
    );
}

/// A forged delivery before any genuine one: `401`, and nothing stored under its id: the
/// genuine delivery after it runs (not a replay) and mails the one notice.
async fn a_forged_first_delivery_is_401_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let demo = payments_demo(dir.path(), Duration::ZERO).await;
    let forged = "whsec_Zm9yZ2VkLWJ5LXNvbWVib2R5LWVsc2U=";
    let answer = send(&demo.app, refund_event("evt_2", forged)).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    assert_eq!(answer.json()["code"], "webhook_unverified");
    assert_eq!(demo.mailer.sent(), 0, "a forgery mails nothing");
    let genuine = send(&demo.app, refund_event("evt_2", DEMO_WEBHOOK_SECRET)).await;
    assert_eq!(genuine.status, StatusCode::OK, "{:?}", genuine.json());
    assert!(!genuine.replayed(), "the forgery left no record to replay");
    assert_eq!(demo.mailer.sent(), 1);
}

/// A store that fails the first record of the `authorise` step's output (not its
/// intent) and passes everything else: the store unreachable right after the gateway
/// charged.
#[derive(Debug)]
struct LosesTheChargesRecord {
    inner: Arc<dyn Store>,
    /// How many of the charge's output records it has failed.
    lost: AtomicUsize,
}

#[async_trait::async_trait]
impl Forward for LosesTheChargesRecord {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn record_step(
        &self,
        scope: &str,
        key: &str,
        token: FencingToken,
        step: &RecordedStep,
    ) -> Result<bool, StoreError> {
        let charge_output = step.name == "authorise" && !step.is_intent();
        if charge_output && self.lost.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(StoreError::backend(std::io::Error::other(
                "the store is unreachable",
            )));
        }
        self.inner.record_step(scope, key, token, step).await
    }
}

/// A gateway without idempotency keys charges, and the store loses the charge's record
/// (answered `503`; the claim released, its steps kept). The retry: at most once, it
/// finds the intent, asks the gateway for a charge under the derived key and completes
/// with it — one charge; at least once (no intent recorded) it charges again — two.
async fn a_charge_whose_record_the_store_lost(authorise: Authorise) {
    let dir = tempfile::tempdir().unwrap();
    let variant = DemoVariant {
        keys: KeyHandling::Ignore,
        authorise,
        wrap_store: Some(Box::new(|store| {
            Arc::new(LosesTheChargesRecord {
                inner: store,
                lost: AtomicUsize::new(0),
            })
        })),
    };
    let demo = payments_demo_with(
        dir.path(),
        Duration::ZERO,
        |gateway| async move { GatewayClient::new(gateway) },
        variant,
    )
    .await;
    let lost = send(
        &demo.app,
        post_payment("sk_test_alice", Some("lost-1"), CHARGE),
    )
    .await;
    assert_eq!(
        lost.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        lost.json()
    );
    assert_eq!(
        demo.gateway.all().await.unwrap().len(),
        1,
        "charged before the loss"
    );
    let retried = send(
        &demo.app,
        post_payment("sk_test_alice", Some("lost-1"), CHARGE),
    )
    .await;
    assert_eq!(retried.status, StatusCode::CREATED, "{:?}", retried.json());
    let charges = demo.gateway.all().await.unwrap();
    match authorise {
        Authorise::AtMostOnce => {
            assert_eq!(charges.len(), 1, "verified, not charged again: {charges:?}");
            assert_eq!(retried.json()["id"], charges[0].id.as_str());
        }
        Authorise::AtLeastOnce => {
            assert_eq!(
                charges.len(),
                2,
                "charged again without the intent: {charges:?}"
            )
        }
    }
}
