//! The published policy (the guide's chapter `idempotent_runtime::guide::openapi`): both
//! demos, started as real processes with a TTL and lease of their own, serve
//! `/openapi.json`; the document parses as strict OpenAPI 3.1, and the protected
//! operation carries the key parameter, the problem answers, `Idempotent-Replayed` and
//! the policy with the TTL and lease the process was started with, while the unprotected
//! operations carry none of it. What the demos themselves answer is documented too
//! (bearer auth's `401`, the JSON extractor's `415` and `422`), and the library's `413`,
//! which no fuzzer reaches with a body under the limit, is sent and compared with the
//! document here (schemathesis checks the rest: `schemathesis.rs`).

use idempotent_runtime::testing::{Trial, async_trial};
use serde_json::Value;

use crate::support::process::Instance;

pub(crate) fn trials() -> Vec<Trial> {
    vec![
        async_trial(
            "the_payments_demo_publishes_its_policy",
            the_payments_demo_publishes_its_policy,
        ),
        async_trial(
            "the_ledger_demo_publishes_its_policy",
            the_ledger_demo_publishes_its_policy,
        ),
        async_trial(
            "a_body_over_the_limit_is_the_published_413",
            a_body_over_the_limit_is_the_published_413,
        ),
    ]
}

const PAYMENTS: &str = env!("CARGO_BIN_EXE_payments-demo");
const LEDGER: &str = env!("CARGO_BIN_EXE_ledger-demo");

/// Starts `binary` on a fresh SQLite file with `--ttl 2h --lease 45s`, fetches its
/// `/openapi.json` and parses it as OpenAPI 3.1; `protected` is the one idempotent
/// operation (`POST`).
async fn published(binary: &str, protected: &str) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("demo.db").display());
    let demo = Instance::start(binary, &url, &["--ttl", "2h", "--lease", "45s"]).await;
    let response = reqwest::get(demo.url("/openapi.json")).await.unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    validate(&text, protected);
    serde_json::from_str(&text).unwrap()
}

/// The document through a typed OpenAPI 3.1 model (`oas3`): it deserialises, declares a
/// 3.1 version, every reference in every operation resolves, and the protected
/// operation's key parameter reads as a required header.
fn validate(text: &str, protected: &str) {
    let spec = oas3::from_json(text).unwrap_or_else(|err| panic!("not OpenAPI 3.1: {err}\n{text}"));
    let version = spec
        .validate_version()
        .expect("a supported OpenAPI version");
    assert_eq!((version.major, version.minor), (3, 1));
    let mut operations = 0;
    for (path, method, operation) in spec.operations() {
        operations += 1;
        let parameters = operation.parameters(&spec).unwrap();
        assert_eq!(
            parameters.len(),
            operation.parameters.len(),
            "{method} {path}"
        );
        let responses = operation.responses(&spec);
        let declared = operation.responses.as_ref().map_or(0, |r| r.len());
        assert_eq!(
            responses.len(),
            declared,
            "{method} {path}: a response does not resolve"
        );
        for (status, response) in &responses {
            for (media, content) in &response.content {
                content
                    .schema(&spec)
                    .unwrap_or_else(|err| panic!("{method} {path} {status} {media}: {err}"));
            }
        }
        if path == protected && method == http::Method::POST {
            let key = operation
                .parameter("Idempotency-Key", &spec)
                .unwrap()
                .unwrap_or_else(|| panic!("{method} {path}: no Idempotency-Key parameter"));
            assert!(matches!(key.location, oas3::spec::ParameterIn::Header));
            assert_eq!(key.required, Some(true));
        }
    }
    assert!(operations >= 2, "{text}");
}

/// What every protected operation must carry, with the demos' `--ttl 2h --lease 45s`.
fn assert_protected(doc: &Value, path: &str) {
    let operation = &doc["paths"][path]["post"];
    let key: Vec<&Value> = operation["parameters"]
        .as_array()
        .unwrap_or_else(|| panic!("{path}: no parameters: {operation}"))
        .iter()
        .filter(|parameter| parameter["name"] == "Idempotency-Key")
        .collect();
    assert_eq!(key.len(), 1, "{path}: {operation}");
    assert_eq!(key[0]["in"], "header");
    assert_eq!(key[0]["required"], true);
    assert_eq!(key[0]["schema"]["type"], "string");
    assert!(
        key[0]["schema"]["pattern"]
            .as_str()
            .is_some_and(|pattern| pattern.contains("{1,255}")),
        "{path}: {}",
        key[0]
    );

    let responses = &operation["responses"];
    for (status, code) in [
        ("400", "idempotency_key_missing"),
        ("409", "request_in_progress"),
        ("413", "payload_too_large"),
        ("422", "idempotency_key_reused"),
        ("500", "request_interrupted"),
        ("503", "idempotency_store_unavailable"),
        // The demos' own: bearer auth, the JSON extractor.
        ("401", "unauthenticated"),
        ("415", "unsupported_media_type"),
        ("422", "unprocessable_entity"),
    ] {
        let response = &responses[status];
        assert_eq!(
            response["content"]["application/problem+json"]["schema"]["$ref"],
            "#/components/schemas/Problem",
            "{path} {status}: {response}"
        );
        let description = response["description"].as_str().unwrap();
        assert!(description.contains(code), "{path} {status}: {description}");
    }
    assert_eq!(
        responses["409"]["headers"]["Retry-After"]["schema"]["type"],
        "integer"
    );
    let created = &responses["201"];
    assert!(
        created["headers"]["Idempotent-Replayed"].is_object(),
        "{path}: {created}"
    );
    assert!(
        created["headers"]["Location"].is_object(),
        "{path}: {created}"
    );
    assert!(
        created["content"]["application/json"].is_object(),
        "{path}: {created}"
    );

    let policy = &operation["x-idempotency"];
    assert_eq!(policy["key"], "required", "{path}: {policy}");
    assert_eq!(policy["ttl_seconds"], 7200, "{path}: {policy}");
    assert_eq!(policy["lease_seconds"], 45, "{path}: {policy}");
    assert_eq!(policy["fingerprint"], "raw", "{path}: {policy}");
    assert_eq!(policy["on_server_error"], "release", "{path}: {policy}");
    let description = operation["description"].as_str().unwrap();
    for text in [
        "`Idempotency-Key` header (required)",
        "remembered for 2h",
        "its 45s lease",
    ] {
        assert!(
            description.contains(text),
            "{path}: {text:?} in {description}"
        );
    }

    let problem = &doc["components"]["schemas"]["Problem"];
    for field in ["type", "title", "status", "detail", "code"] {
        assert!(
            problem["properties"][field].is_object(),
            "{field}: {problem}"
        );
    }
    assert_bearer(doc, operation, path);
}

/// The operation requires the bearer scheme the document declares, and documents its `401`.
fn assert_bearer(doc: &Value, operation: &Value, path: &str) {
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"],
        serde_json::json!({
            "type": "http",
            "scheme": "bearer",
            "description": doc["components"]["securitySchemes"]["bearer"]["description"],
        })
    );
    assert_eq!(
        operation["security"],
        serde_json::json!([{ "bearer": [] }]),
        "{path}"
    );
    let unauthorized = &operation["responses"]["401"];
    assert!(
        unauthorized["description"]
            .as_str()
            .is_some_and(|d| d.contains("unauthenticated")),
        "{path}: {unauthorized}"
    );
}

/// An operation without idempotency: none of it.
fn assert_unprotected(doc: &Value, path: &str) {
    let operation = &doc["paths"][path]["get"];
    assert!(
        operation["responses"]["200"].is_object(),
        "{path}: {operation}"
    );
    let text = operation.to_string();
    for absent in [
        "Idempotency-Key",
        "Idempotent-Replayed",
        "x-idempotency",
        "idempotency_",
    ] {
        assert!(!text.contains(absent), "{path} mentions {absent}: {text}");
    }
    // Its only problem is the demo's own `401`.
    for status in ["409", "413", "422", "500", "503"] {
        assert!(
            operation["responses"].get(status).is_none(),
            "{path}: {operation}"
        );
    }
    assert_bearer(doc, operation, path);
}

async fn the_payments_demo_publishes_its_policy() {
    let doc = published(PAYMENTS, "/payments").await;
    assert_protected(&doc, "/payments");
    let post = &doc["paths"]["/payments"]["post"];
    // The handler's own answers keep what it documented, and are replayed too.
    let bad = post["responses"]["400"]["description"].as_str().unwrap();
    assert!(
        bad.starts_with("Invalid amount or currency (`invalid_request`; recorded and replayed)"),
        "{bad}"
    );
    assert!(post["responses"]["402"]["headers"]["Idempotent-Replayed"].is_object());
    let unavailable = post["responses"]["503"]["description"].as_str().unwrap();
    assert!(unavailable.contains("gateway_unavailable"), "{unavailable}");
    // A 5xx is released, never replayed.
    assert!(
        post["responses"]["503"]["headers"]
            .get("Idempotent-Replayed")
            .is_none()
    );
    assert_unprotected(&doc, "/payments");
    // `GET /payments/{id}` has its own 404 problem, and nothing of idempotency.
    let get = &doc["paths"]["/payments/{id}"]["get"];
    assert!(
        get["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["in"] == "path"),
        "{get}"
    );
    assert!(get.get("x-idempotency").is_none(), "{get}");
    assert_bearer(&doc, get, "/payments/{id}");
    // The body's schema states what the handler accepts.
    let charge = &doc["components"]["schemas"]["ChargeRequest"];
    assert_eq!(
        charge["required"],
        serde_json::json!(["amount", "currency"]),
        "{charge}"
    );
    let amount = &charge["properties"]["amount"];
    assert_eq!(amount["type"], "integer", "{amount}");
    assert_eq!(amount["minimum"], 1, "{amount}");
    assert_eq!(amount["maximum"], i64::MAX, "{amount}");
    let currency = &charge["properties"]["currency"];
    assert_eq!(currency["pattern"], "^[A-Z]{3}$", "{currency}");
    assert_eq!(
        (&currency["minLength"], &currency["maxLength"]),
        (&3.into(), &3.into()),
        "{currency}"
    );
}

async fn the_ledger_demo_publishes_its_policy() {
    let doc = published(LEDGER, "/deposits").await;
    assert_protected(&doc, "/deposits");
    assert_unprotected(&doc, "/balance");
    // The deposit's bounds are the handler's.
    let amount = &doc["components"]["schemas"]["DepositRequest"]["properties"]["amount"];
    assert_eq!(amount["minimum"], 1, "{amount}");
    assert_eq!(
        amount["maximum"],
        idempotent_demo::ledger::MAX_DEPOSIT,
        "{amount}"
    );
}

/// The library's body cap, which no generated request reaches: a body over axum's default
/// `DefaultBodyLimit` (2 MiB) is the `413 payload_too_large` the document lists.
async fn a_body_over_the_limit_is_the_published_413() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("demo.db").display());
    let demo = Instance::start(PAYMENTS, &url, &[]).await;
    let doc: Value = reqwest::get(demo.url("/openapi.json"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let padding = "x".repeat(3 << 20);
    let body = format!(r#"{{"amount": 100, "currency": "BRL", "padding": "{padding}"}}"#);
    let response = reqwest::Client::new()
        .post(demo.url("/payments"))
        .bearer_auth("sk_test_alice")
        .header("idempotency-key", "over-the-limit")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16().to_string();
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    let problem: Value = response.json().await.unwrap();
    assert_eq!(status, "413", "{problem}");
    let code = problem["code"].as_str().unwrap();
    assert_eq!(code, "payload_too_large");
    let documented = &doc["paths"]["/payments"]["post"]["responses"][&status];
    assert_eq!(
        documented["content"][&content_type]["schema"]["$ref"], "#/components/schemas/Problem",
        "{documented}"
    );
    let description = documented["description"].as_str().unwrap_or_default();
    assert!(description.contains(code), "{status}: {documented}");
}
