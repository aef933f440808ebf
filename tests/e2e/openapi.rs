//! The published policy (the guide's chapter `idempotent_runtime::guide::openapi`): both
//! demos, started as real processes with a TTL and lease of their own, serve
//! `/openapi.json`; the document parses as strict OpenAPI 3.1, and the protected
//! operation carries the key parameter, the problem answers, `Idempotent-Replayed` and
//! the policy with the TTL and lease the process was started with, while the unprotected
//! operations carry none of it.

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
    assert_eq!(key[0]["schema"]["maxLength"], 255);

    let responses = &operation["responses"];
    for (status, code) in [
        ("400", "idempotency_key_missing"),
        ("409", "request_in_progress"),
        ("422", "idempotency_key_reused"),
        ("503", "idempotency_store_unavailable"),
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
        "problem+json",
    ] {
        assert!(!text.contains(absent), "{path} mentions {absent}: {text}");
    }
    for status in ["409", "422"] {
        assert!(
            operation["responses"].get(status).is_none(),
            "{path}: {operation}"
        );
    }
}

async fn the_payments_demo_publishes_its_policy() {
    let doc = published(PAYMENTS, "/payments").await;
    assert_protected(&doc, "/payments");
    let post = &doc["paths"]["/payments"]["post"];
    // The handler's own answers keep what it documented, and are replayed too.
    let bad = post["responses"]["400"]["description"].as_str().unwrap();
    assert!(
        bad.starts_with("Invalid amount or currency (`invalid_request`)."),
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
}

async fn the_ledger_demo_publishes_its_policy() {
    let doc = published(LEDGER, "/deposits").await;
    assert_protected(&doc, "/deposits");
    assert_unprotected(&doc, "/balance");
}
