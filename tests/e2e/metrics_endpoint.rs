//! The payments demo's `GET /metrics`, end to end: a real demo process on an SQLite file
//! serves the engine's counters and histograms in the Prometheus text format.

use idempotent_runtime::testing::{Trial, async_trial};
use reqwest::StatusCode;

use crate::support::process::Instance;

pub(crate) fn trials() -> Vec<Trial> {
    vec![async_trial(
        "payments_demo_serves_its_counters_in_prometheus_text",
        payments_demo_serves_its_counters_in_prometheus_text,
    )]
}

const DEMO: &str = env!("CARGO_BIN_EXE_payments-demo");

/// The attribute names the handler after its module path in the demo library.
const HANDLER: &str = "idempotent_demo::payments::create_payment";

async fn charge(client: &reqwest::Client, demo: &Instance, key: Option<&str>) -> StatusCode {
    let mut request = client
        .post(demo.url("/payments"))
        .header("authorization", "Bearer sk_test_alice")
        .header("content-type", "application/json")
        .body(r#"{"amount": 10000, "currency": "BRL"}"#);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request.send().await.expect("the demo answers").status()
}

async fn payments_demo_serves_its_counters_in_prometheus_text() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("payments.db").display());
    let demo = Instance::start(DEMO, &url, &[]).await;
    let client = reqwest::Client::new();
    assert_eq!(
        charge(&client, &demo, Some("order-1")).await,
        StatusCode::CREATED
    );
    assert_eq!(
        charge(&client, &demo, Some("order-1")).await,
        StatusCode::CREATED
    );
    assert_eq!(charge(&client, &demo, None).await, StatusCode::BAD_REQUEST);

    let response = client
        .get(demo.url("/metrics"))
        .send()
        .await
        .expect("the demo answers");
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let text = response.text().await.expect("a text body");
    let lines: Vec<&str> = text.lines().collect();
    for expected in [
        "# TYPE idempotent_requests_total counter".to_owned(),
        format!(r#"idempotent_requests_total{{handler="{HANDLER}",outcome="claimed"}} 1"#),
        format!(r#"idempotent_requests_total{{handler="{HANDLER}",outcome="replayed"}} 1"#),
        // Refused in the attribute's extractor, before the handler's name is known: by route.
        r#"idempotent_requests_total{handler="/payments",outcome="key_missing"} 1"#.to_owned(),
        "# TYPE idempotent_handler_duration_seconds histogram".to_owned(),
        format!(r#"idempotent_handler_duration_seconds_count{{handler="{HANDLER}"}} 1"#),
        "# TYPE idempotent_store_operation_duration_seconds histogram".to_owned(),
        // The charge's claim, and its replay's: a key's first replay asks the store (the
        // replay cache takes the records the store replays, not every completion).
        r#"idempotent_store_operation_duration_seconds_count{operation="claim",result="ok"} 2"#
            .to_owned(),
        r#"idempotent_store_operation_duration_seconds_count{operation="complete",result="ok"} 1"#
            .to_owned(),
    ] {
        assert!(
            lines.contains(&expected.as_str()),
            "missing `{expected}` in:\n{text}"
        );
    }
    assert!(
        !text.contains("order-1") && !text.contains("alice"),
        "no key or scope in any label:\n{text}"
    );
}
