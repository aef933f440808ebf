//! The published policy against a real OpenAPI fuzzer: schemathesis (PyPI, 4.x; its path
//! in `IDEMPOTENT_TEST_SCHEMATHESIS`, else the test is reported ignored; `.ci/run` installs
//! it) reads each demo's `/openapi.json`, generates requests from it (examples,
//! boundary values, random and schema-violating data, and sequences following the
//! document's links) and runs every check it has on the answers: no 5xx, every status,
//! content type, header and body as documented, schema-violating requests refused,
//! schema-valid ones accepted, authentication enforced, undocumented methods answered
//! `405` with `Allow`.
//!
//! Any finding fails the test, with schemathesis' report, except the one the protocol
//! intends: a generated request that reuses an idempotency key another generated request
//! used with other content is refused `422 idempotency_key_reused`, which schemathesis
//! counts as a schema-valid request rejected. That one is recognised by the answer's
//! `code`, not by its status.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use base64::Engine as _;
use idempotent_runtime::problem::codes;
use idempotent_runtime::testing::{Trial, async_trial, ignored_if};
use serde_json::Value;

use crate::support::process::Instance;

/// The variable naming the `schemathesis` executable.
const ENV: &str = "IDEMPOTENT_TEST_SCHEMATHESIS";

const PAYMENTS: &str = env!("CARGO_BIN_EXE_payments-demo");
const LEDGER: &str = env!("CARGO_BIN_EXE_ledger-demo");

/// Test cases per operation and phase: enough to reach every documented answer of the
/// demo (and the key reuse) in each run, few enough to finish in well under a minute.
const MAX_EXAMPLES: &str = "150";

pub(crate) fn trials() -> Vec<Trial> {
    let unavailable = match std::env::var(ENV) {
        Ok(path) if !path.is_empty() => None,
        _ => Some(format!(
            "{ENV} is not set (the path of a schemathesis 4 executable; \
             `pip install schemathesis`)"
        )),
    };
    ignored_if(
        unavailable,
        vec![
            async_trial(
                "the_payments_demo_answers_as_its_document_says",
                the_payments_demo_answers_as_its_document_says,
            ),
            async_trial(
                "the_ledger_demo_answers_as_its_document_says",
                the_ledger_demo_answers_as_its_document_says,
            ),
        ],
    )
}

async fn the_payments_demo_answers_as_its_document_says() {
    // No gateway latency: thousands of charges, each as fast as the store allows.
    fuzz(PAYMENTS, &["--gateway-latency-ms", "0"], 3).await;
}

async fn the_ledger_demo_answers_as_its_document_says() {
    fuzz(LEDGER, &[], 2).await;
}

/// Starts `binary` with `args` on a fresh SQLite file and judges a schemathesis run
/// against its document, which has `operations` operations.
async fn fuzz(binary: &str, args: &[&str], operations: u64) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("demo.db").display());
    let demo = Instance::start(binary, &url, args).await;
    let document = demo.url("/openapi.json");
    let reports = dir.path().to_owned();
    let started = Instant::now();
    let run = tokio::task::spawn_blocking(move || schemathesis(&document, &reports))
        .await
        .unwrap();
    eprintln!(
        "schemathesis: {} test cases in {:.1?}",
        run.report["test_cases"]["generated"],
        started.elapsed()
    );
    drop(demo);
    run.judge(operations);
}

/// One finished schemathesis run: what it printed and its reports.
struct Run {
    /// Exit status, standard output and error: the human-readable report.
    printed: String,
    exit_code: Option<i32>,
    /// The JSON run report (totals, errors, whether it completed).
    report: Value,
    /// The NDJSON event stream: every case, its checks and its request and answer.
    events: Vec<Value>,
}

/// Runs schemathesis with every check against `document`, writing its reports (and
/// anything else it keeps) in `dir`.
fn schemathesis(document: &str, dir: &Path) -> Run {
    let program = std::env::var(ENV).unwrap();
    let json = dir.join("run.json");
    let ndjson = dir.join("events.ndjson");
    let output = Command::new(&program)
        .current_dir(dir)
        .args(["run", document, "--checks", "all"])
        .args(["--header", "Authorization: Bearer sk_test_alice"])
        .args(["--max-examples", MAX_EXAMPLES])
        // One worker: two generated requests with one key at once would be a `409` race
        // the document allows, but not what this test looks at.
        .args(["--workers", "1", "--request-timeout", "10"])
        .args(["--no-color", "--output-sanitize", "false"])
        .args(["--generation-database", "none"])
        .args(["--report", "json,ndjson"])
        .arg("--report-json-path")
        .arg(&json)
        .arg("--report-ndjson-path")
        .arg(&ndjson)
        .output()
        .unwrap_or_else(|err| panic!("cannot run {ENV}={program}: {err}"));
    let printed = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let read = |path: &Path| {
        std::fs::read_to_string(path)
            .unwrap_or_else(|err| panic!("no report {}: {err}\n{printed}", path.display()))
    };
    let report = serde_json::from_str(&read(&json)).unwrap();
    let events = read(&ndjson)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    Run {
        printed,
        exit_code: output.status.code(),
        report,
        events,
    }
}

/// A check that failed on one case.
struct Finding {
    check: String,
    status: u64,
    code: Option<String>,
    message: String,
}

impl Finding {
    /// The refusal the protocol intends: a generated key reused with other content.
    fn is_intended(&self) -> bool {
        self.check == "positive_data_acceptance"
            && self.status == 422
            && self.code.as_deref() == Some(codes::KEY_REUSED)
    }
}

impl Run {
    /// Fails (with the report) on any finding but the intended one, on any error, and on
    /// a run that did not reach the demo's main answers.
    fn judge(&self, operations: u64) {
        let verdict = |problem: String| -> ! {
            panic!("{problem}\n\nschemathesis' report:\n{}", self.printed)
        };
        if !matches!(self.exit_code, Some(0 | 1)) {
            verdict(format!("schemathesis exited {:?}", self.exit_code));
        }
        let report = &self.report;
        if report["complete"] != true
            || !report["errors"].as_array().is_some_and(Vec::is_empty)
            || report["operations"]["errored"] != 0
            || report["test_cases"]["errored"] != 0
        {
            verdict(format!("the run did not complete cleanly: {report}"));
        }
        if report["operations"]["tested"] != operations {
            verdict(format!(
                "not all {operations} operations tested: {}",
                report["operations"]
            ));
        }
        let (findings, statuses) = self.findings();
        let unintended: Vec<String> = findings
            .iter()
            .filter(|finding| !finding.is_intended())
            .map(|finding| {
                format!(
                    "{} on a {} ({}): {}",
                    finding.check,
                    finding.status,
                    finding.code.as_deref().unwrap_or("no code"),
                    finding.message
                )
            })
            .collect();
        if !unintended.is_empty() {
            verdict(format!(
                "{} finding(s) besides the intended key reuse:\n- {}",
                unintended.len(),
                unintended.join("\n- ")
            ));
        }
        eprintln!(
            "schemathesis: {} intended key-reuse refusals; statuses answered: {statuses:?}",
            findings.len()
        );
        // A run that never got past authentication or never charged proves nothing.
        for status in [201, 400, 401, 415, 422] {
            if !statuses.contains(&status) {
                verdict(format!(
                    "no {status} among the answers schemathesis got: {statuses:?}"
                ));
            }
        }
    }

    /// Every failed check of every case, and every status answered.
    fn findings(&self) -> (Vec<Finding>, BTreeSet<u64>) {
        let mut findings = Vec::new();
        let mut statuses = BTreeSet::new();
        let recorders = self
            .events
            .iter()
            .filter_map(|event| event.get("ScenarioFinished"))
            .map(|scenario| &scenario["recorder"]);
        for recorder in recorders {
            let interactions = recorder["interactions"].as_object();
            for interaction in interactions.into_iter().flat_map(|all| all.values()) {
                if let Some(status) = interaction["response"]["status_code"].as_u64() {
                    statuses.insert(status);
                }
            }
            let Some(checks) = recorder["checks"].as_object() else {
                continue;
            };
            for (case, checks) in checks {
                let response = &recorder["interactions"][case]["response"];
                for check in checks.as_array().into_iter().flatten() {
                    if check["status"] != "failure" {
                        continue;
                    }
                    findings.push(Finding {
                        check: check["name"].as_str().unwrap_or("?").to_owned(),
                        status: response["status_code"].as_u64().unwrap_or(0),
                        code: problem_code(response),
                        message: check["failure_info"]["failure"]["message"]
                            .as_str()
                            .unwrap_or("")
                            .to_owned(),
                    });
                }
            }
        }
        (findings, statuses)
    }
}

/// The `code` of a problem+json answer recorded in the NDJSON report.
fn problem_code(response: &Value) -> Option<String> {
    let encoded = response["content"]["$base64"].as_str()?;
    let body = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let problem: Value = serde_json::from_slice(&body).ok()?;
    Some(problem["code"].as_str()?.to_owned())
}
