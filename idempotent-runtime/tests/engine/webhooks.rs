//! Incoming Standard Webhooks behind `IdempotencyLayer::standard_webhooks`: verified before
//! anything is claimed, then run once per `webhook-id`, redeliveries replayed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::webhook::{WebhookSecret, WebhookVerifier};
use idempotent_runtime::{Idempotency, IdempotencyLayer};
use tower::ServiceExt;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const ROTATED: &str = "whsec_c2VjcmV0LWFmdGVyLXJvdGF0aW9u";
const EVENT: &str = r#"{"type":"charge.succeeded","data":{"id":"ch_1","amount":1200}}"#;

/// A receiver that books every event it runs, with its booking number in the answer.
fn receiver(engine: &Idempotency, booked: Arc<AtomicUsize>) -> Router {
    let verifier = WebhookVerifier::new([SECRET, ROTATED]).unwrap();
    let handler = move |body: String| {
        let booked = booked.clone();
        async move {
            let booking = booked.fetch_add(1, Ordering::SeqCst) + 1;
            (
                StatusCode::OK,
                format!("booking {booking} of {}", body.len()),
            )
        }
    };
    Router::new()
        .route("/webhooks/gateway", post(handler))
        .route_layer(IdempotencyLayer::new(engine.clone()).standard_webhooks("gateway", verifier))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A delivery of `body` as event `id`, signed with `secret` now.
fn delivery(id: &str, body: &str, secret: &str) -> Request<Body> {
    let timestamp = now();
    let signature = WebhookSecret::parse(secret)
        .unwrap()
        .sign(id, timestamp, body.as_bytes());
    Request::post("/webhooks/gateway")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(Body::from(body.to_owned()))
        .unwrap()
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, Option<String>, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .map(|value| value.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, replayed, String::from_utf8(body.to_vec()).unwrap())
}

/// Ten deliveries of one event, the third with a forged signature: the forgery is `401`
/// and claims nothing, the event is booked once, every other delivery replays its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_event_runs_once_and_a_forgery_among_them_is_refused() {
    let engine = Idempotency::new(MemoryStore::new());
    let booked = Arc::new(AtomicUsize::new(0));
    let app = receiver(&engine, booked.clone());
    let forged = "whsec_Zm9yZ2VkLWJ5LXNvbWVib2R5LWVsc2U=";

    let first = send(&app, delivery("msg_1", EVENT, SECRET)).await;
    assert_eq!(first.0, StatusCode::OK);
    assert_eq!(first.1, None);
    for attempt in 2..=10 {
        let (status, replayed, body) = if attempt == 3 {
            send(&app, delivery("msg_1", EVENT, forged)).await
        } else if attempt % 2 == 0 {
            // A sender rotating its secret signs with the new one: still this event.
            send(&app, delivery("msg_1", EVENT, ROTATED)).await
        } else {
            send(&app, delivery("msg_1", EVENT, SECRET)).await
        };
        if attempt == 3 {
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
            assert!(body.contains("\"code\":\"webhook_unverified\""), "{body}");
            assert!(body.contains("\"reason\":\"signature_mismatch\""), "{body}");
        } else {
            assert_eq!(
                (status, replayed.as_deref()),
                (StatusCode::OK, Some("true"))
            );
            assert_eq!(body, first.2);
        }
    }
    assert_eq!(booked.load(Ordering::SeqCst), 1);
}

/// A forged delivery of an event nobody has delivered yet stores nothing: the genuine
/// delivery after it runs.
#[tokio::test]
async fn a_refused_delivery_claims_nothing() {
    let engine = Idempotency::new(MemoryStore::new());
    let booked = Arc::new(AtomicUsize::new(0));
    let app = receiver(&engine, booked.clone());
    let mut stale = delivery("msg_2", EVENT, SECRET);
    let old = (now() - 3600).to_string();
    let signature =
        WebhookSecret::parse(SECRET)
            .unwrap()
            .sign("msg_2", now() - 3600, EVENT.as_bytes());
    stale
        .headers_mut()
        .insert("webhook-timestamp", old.parse().unwrap());
    stale
        .headers_mut()
        .insert("webhook-signature", signature.parse().unwrap());

    let (status, _, body) = send(&app, stale).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body.contains("timestamp_out_of_tolerance"), "{body}");
    let mut unsigned = delivery("msg_2", EVENT, SECRET);
    unsigned.headers_mut().remove("webhook-signature");
    let (status, _, body) = send(&app, unsigned).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body.contains("header_missing"), "{body}");
    assert_eq!(
        engine.inspect("webhook:gateway", "msg_2").await.unwrap(),
        None
    );

    let (status, replayed, _) = send(&app, delivery("msg_2", EVENT, SECRET)).await;
    assert_eq!((status, replayed), (StatusCode::OK, None));
    assert_eq!(booked.load(Ordering::SeqCst), 1);
    assert!(
        engine
            .inspect("webhook:gateway", "msg_2")
            .await
            .unwrap()
            .is_some()
    );
}

/// 32 deliveries of one event at once (a sender's retries racing its first attempt): one
/// booking; each of the others is a replay or `409` in progress, never a second run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_deliveries_of_one_event_run_it_once() {
    let engine = Idempotency::new(MemoryStore::new());
    let booked = Arc::new(AtomicUsize::new(0));
    let app = receiver(&engine, booked.clone());
    let deliveries: Vec<_> = (0..32)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, delivery("msg_3", EVENT, SECRET)).await })
        })
        .collect();
    let mut ran = 0;
    for delivery in deliveries {
        let (status, replayed, _) = delivery.await.unwrap();
        match (status, replayed.as_deref()) {
            (StatusCode::OK, None) => ran += 1,
            (StatusCode::OK, Some("true")) | (StatusCode::CONFLICT, _) => {}
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!((ran, booked.load(Ordering::SeqCst)), (1, 1));
}

/// The same event id from two senders is two events: scopes are per sender.
#[tokio::test]
async fn senders_do_not_share_event_ids() {
    let engine = Idempotency::new(MemoryStore::new());
    let booked = Arc::new(AtomicUsize::new(0));
    let gateway = receiver(&engine, booked.clone());
    let verifier = WebhookVerifier::new([SECRET]).unwrap();
    let counter = booked.clone();
    let crm = Router::new()
        .route(
            "/webhooks/gateway",
            post(move || {
                let counter = counter.clone();
                async move { counter.fetch_add(1, Ordering::SeqCst).to_string() }
            }),
        )
        .route_layer(IdempotencyLayer::new(engine.clone()).standard_webhooks("crm", verifier));
    assert_eq!(
        send(&gateway, delivery("msg_4", EVENT, SECRET)).await.0,
        StatusCode::OK
    );
    let (status, replayed, _) = send(&crm, delivery("msg_4", EVENT, SECRET)).await;
    assert_eq!((status, replayed), (StatusCode::OK, None));
    assert_eq!(booked.load(Ordering::SeqCst), 2);
}
