//! The payments demo's recovery points under `kill -9`: a real demo process is stopped
//! for good right after a step of `POST /payments` is recorded (the demo's
//! `PAYMENTS_DEMO_PAUSE_AFTER_STEP` hook), killed, and restarted on the same database; the
//! client's retry is refused (`409`) until the dead owner's lease runs out, then takes the
//! request over and resumes it: every external effect happened once (the effects log),
//! the ledger holds one row, the resumed steps show in the metrics and the logs, and the
//! client gets the answer a run without the crash gives.
//!
//! On SQLite (a file) always; on Postgres, MySQL and Redis with their test URLs
//! (`IDEMPOTENT_TEST_POSTGRES_URL`, …), else reported ignored. With Redis the ledger row
//! goes to the gateway's SQLite file in a plain step, not an atomic one.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Command;
use std::time::Duration;

use idempotent_demo::database::{self, Database};
use idempotent_demo::payments::PAUSE_LINE;
use idempotent_runtime::testing::{Trial, async_trial, ignored_if};
use reqwest::StatusCode;

use crate::support::process::{self, Instance, Output, Server, TestBackend};

const DEMO: &str = env!("CARGO_BIN_EXE_payments-demo");
const CHARGE: &str = r#"{"amount": 10000, "currency": "BRL"}"#;
/// Short, so the test waits little for the dead owner's lease; long enough that the
/// restarted demo's first retry still finds it held.
const LEASE: &str = "4s";
/// The handler as the metrics and logs name it.
const HANDLER: &str = "idempotent_demo::payments::create_payment";

type Test = fn(Option<Server>, &'static str) -> Pin<Box<dyn Future<Output = ()>>>;

pub(crate) fn trials() -> Vec<Trial> {
    let mut trials = Vec::new();
    // `None` is SQLite on a file, which needs no server.
    for server in [
        None,
        Some(Server::Postgres),
        Some(Server::MySql),
        Some(Server::Redis),
    ] {
        let name = server.map_or("sqlite", Server::name);
        let mut on_server = Vec::new();
        for step in ["authorise", "ledger"] {
            let test: Test = |server, step| Box::pin(kill_9_after_a_step_resumes(server, step));
            on_server.push(async_trial(
                format!("{name}::kill_9_after_{step}_resumes_the_recorded_steps"),
                move || test(server, step),
            ));
        }
        for authorise in ["at-most-once", "at-least-once"] {
            let test: Test = |server, authorise| {
                Box::pin(kill_9_between_the_gateway_call_and_its_record(
                    server, authorise,
                ))
            };
            on_server.push(async_trial(
                format!("{name}::kill_9_between_the_gateway_call_and_its_record_{authorise}"),
                move || test(server, authorise),
            ));
        }
        trials.extend(ignored_if(server.and_then(Server::unavailable), on_server));
    }
    trials
}

/// Where the demo processes of one test keep their state: the database (an SQLite file
/// in `dir`, or a fresh database on a server) and the effects log (in `dir`).
struct Place {
    dir: tempfile::TempDir,
    url: String,
    flags: Vec<String>,
    backend: Option<TestBackend>,
}

impl Place {
    async fn create(server: Option<Server>) -> Place {
        let dir = tempfile::tempdir().expect("temp dir");
        match server {
            None => Place {
                url: format!("sqlite://{}", dir.path().join("payments.db").display()),
                flags: Vec::new(),
                backend: None,
                dir,
            },
            Some(server) => {
                let backend = TestBackend::create(server, "steps").await;
                Place {
                    url: backend.url.clone(),
                    flags: backend.flags.clone(),
                    backend: Some(backend),
                    dir,
                }
            }
        }
    }

    fn effects_log(&self) -> PathBuf {
        self.dir.path().join("effects.log")
    }

    /// The demo, with `pause_after` as its pause hook and `rust_log` as its log filter;
    /// its stderr collected.
    async fn start(&self, pause_after: Option<&str>, rust_log: &str) -> (Instance, Output) {
        self.start_with(pause_after, rust_log, &[]).await
    }

    /// [`start`](Self::start), with `extra` flags.
    async fn start_with(
        &self,
        pause_after: Option<&str>,
        rust_log: &str,
        extra: &[&str],
    ) -> (Instance, Output) {
        let mut command = Command::new(DEMO);
        command.env("RUST_LOG", rust_log);
        command.env_remove("PAYMENTS_DEMO_PAUSE_AFTER_STEP");
        if let Some(step) = pause_after {
            command.env("PAYMENTS_DEMO_PAUSE_AFTER_STEP", step);
        }
        let effects = self.effects_log();
        let mut flags: Vec<&str> = self.flags.iter().map(String::as_str).collect();
        flags.extend([
            "--lease",
            LEASE,
            "--gateway-latency-ms",
            "0",
            "--effects-log",
            effects.to_str().expect("a UTF-8 temp path"),
        ]);
        flags.extend(extra);
        Instance::start_captured(command, &self.url, &flags).await
    }

    /// The database holding the demo's ledger (the store's own, but with Redis).
    async fn tables(&self) -> Database {
        match &self.backend {
            Some(backend) => backend.tables().await,
            None => database::open_tables(&self.url)
                .await
                .expect("open the SQLite file"),
        }
    }

    /// How many ledger rows `payment` has.
    async fn ledger_rows(&self, payment: &str) -> i64 {
        let db = self.tables().await;
        let sql = db.dialect("SELECT COUNT(*) FROM demo_payment_ledger WHERE payment_id = $1");
        idempotent_demo::on_pool!(&db, |pool| sqlx::query_scalar::<_, i64>(
            sqlx::AssertSqlSafe(sql.as_str())
        )
        .bind(payment.to_owned())
        .fetch_one(pool)
        .await
        .expect("count ledger rows"))
    }

    /// The effects log's lines, split into words (`[effect, payment, …]`).
    fn effects(&self) -> Vec<Vec<String>> {
        read_effects(&self.effects_log())
    }
}

fn read_effects(path: &Path) -> Vec<Vec<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => text
            .lines()
            .map(|line| line.split(' ').map(str::to_owned).collect())
            .collect(),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(err) => panic!("read the effects log: {err}"),
    }
}

/// The payments of the `effect` lines in `effects`, in order.
fn payments_with(effects: &[Vec<String>], effect: &str) -> Vec<String> {
    effects
        .iter()
        .filter(|words| words[0] == effect)
        .map(|words| words[1].clone())
        .collect()
}

/// A whole answer.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    replayed: bool,
    location: Option<String>,
    retry_after: Option<String>,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|_| {
            panic!("a JSON body, got {:?}", String::from_utf8_lossy(&self.body))
        })
    }
}

async fn post(client: &reqwest::Client, instance: &Instance, key: &str) -> Answer {
    let response = client
        .post(instance.url("/payments"))
        .header("authorization", "Bearer sk_test_alice")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(CHARGE)
        .send()
        .await
        .expect("the demo answers");
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (status, location, retry_after) =
        (response.status(), header("location"), header("retry-after"));
    let replayed = header("idempotent-replayed").as_deref() == Some("true");
    let body = response.bytes().await.expect("a body").to_vec();
    Answer {
        status,
        replayed,
        location,
        retry_after,
        body,
    }
}

/// The value of the metric line `name{labels}` in the Prometheus text `text`, if present.
fn metric(text: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .map(|value| value.trim().parse().expect("a number"))
}

/// Starts the demo with `flags`, its pause hook at `pause`, sends it a charge under
/// `key`, and kills it (`SIGKILL`) once it has paused there: the client loses its
/// connection, and the store keeps whatever the request recorded before the hook.
async fn crash_at(
    place: &Place,
    client: &reqwest::Client,
    pause: &str,
    flags: &[&str],
    key: &'static str,
) {
    let (mut first, first_output) = place.start_with(Some(pause), "warn", flags).await;
    let in_flight = process::charge_in_flight(client, first.url("/payments"), key, CHARGE);
    let pause_line = format!("{PAUSE_LINE} {pause} ");
    process::wait_until("the first demo pauses at its hook", || {
        let output = first_output.clone();
        let pause_line = pause_line.clone();
        async move { output.has_line_with(&[&pause_line]) }
    })
    .await;
    first.kill();
    assert!(
        in_flight.await.unwrap().is_err(),
        "the client lost its connection"
    );
}

async fn kill_9_after_a_step_resumes(server: Option<Server>, paused_after: &'static str) {
    let place = Place::create(server).await;
    let client = reqwest::Client::new();
    // The steps the first process recorded, which the second must resume.
    let recorded: &[&str] = match paused_after {
        "authorise" => &["authorise"],
        _ => &["authorise", "ledger"],
    };

    crash_at(&place, &client, paused_after, &[], "crash-1").await;

    // Where the crash left things: the gateway authorised, the receipt was not mailed,
    // and the ledger row exists exactly when its step was recorded.
    let effects = place.effects();
    let authorised = payments_with(&effects, "authorised");
    assert_eq!(
        authorised.len(),
        1,
        "one authorisation before the crash: {effects:?}"
    );
    assert!(
        payments_with(&effects, "receipt_sent").is_empty(),
        "{effects:?}"
    );
    let payment = authorised[0].clone();
    let rows_before = i64::from(paused_after == "ledger");
    assert_eq!(place.ledger_rows(&payment).await, rows_before);

    // The engine logs a resumed step at `info`.
    let (second, second_output) = place.start(None, "warn,idempotent_runtime=info").await;
    let blocked = post(&client, &second, "crash-1").await;
    assert_eq!(
        blocked.status,
        StatusCode::CONFLICT,
        "the dead owner's lease still holds: {:?}",
        String::from_utf8_lossy(&blocked.body)
    );
    assert!(blocked.retry_after.is_some(), "409 carries Retry-After");
    let mut resumed = None;
    for _ in 0..60 {
        let answer = post(&client, &second, "crash-1").await;
        if answer.status != StatusCode::CONFLICT {
            resumed = Some(answer);
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let resumed = resumed.expect("taken over once the lease ran out");
    assert_eq!(
        resumed.status,
        StatusCode::CREATED,
        "{:?}",
        String::from_utf8_lossy(&resumed.body)
    );
    assert!(!resumed.replayed, "the takeover ran the handler");

    // Every effect once: the authorisation was resumed, not repeated; the receipt was
    // mailed by the second process only; one ledger row.
    let effects = place.effects();
    assert_eq!(
        payments_with(&effects, "authorised"),
        [payment.as_str()],
        "{effects:?}"
    );
    assert_eq!(
        payments_with(&effects, "receipt_sent"),
        [payment.as_str()],
        "{effects:?}"
    );
    assert_eq!(effects.len(), 2, "{effects:?}");
    assert_eq!(place.ledger_rows(&payment).await, 1, "one ledger row");

    // The resumed steps, in the metrics and the logs of the second process.
    let metrics = client
        .get(second.url("/metrics"))
        .send()
        .await
        .expect("the demo answers")
        .text()
        .await
        .expect("a text body");
    let labels = format!(r#"handler="{HANDLER}",outcome="resumed""#);
    assert_eq!(
        metric(&metrics, "idempotent_steps_total", &labels),
        Some(recorded.len() as f64),
        "{metrics}"
    );
    for step in recorded {
        let step_field = format!("step=\"{step}\"");
        assert!(
            second_output.has_line_with(&["step_resumed", &step_field]),
            "no step_resumed log for {step}: {:#?}",
            second_output.lines()
        );
    }

    // The answer a run without the crash gives: the replay of the key is the same, and a
    // crash-free charge on another key has the same shape.
    let replay = post(&client, &second, "crash-1").await;
    assert!(replay.replayed);
    assert_eq!(
        (replay.status, &replay.location, &replay.body),
        (resumed.status, &resumed.location, &resumed.body)
    );
    let body = resumed.json();
    assert_eq!(
        body["id"],
        payment.as_str(),
        "the recorded authorisation's payment"
    );
    assert_eq!(resumed.location, Some(format!("/payments/{payment}")));
    let calm = post(&client, &second, "calm-1").await;
    assert_eq!(calm.status, StatusCode::CREATED);
    assert!(!calm.replayed);
    let calm_body = calm.json();
    let shape = |body: &serde_json::Value| {
        let mut shape = body.as_object().expect("an object").clone();
        shape.remove("id");
        shape
    };
    assert_eq!(shape(&body), shape(&calm_body));
    assert_eq!(
        body.as_object().unwrap().keys().collect::<Vec<_>>(),
        calm_body.as_object().unwrap().keys().collect::<Vec<_>>()
    );
    let calm_id = calm_body["id"].as_str().expect("an id");
    assert!(calm_id.starts_with("pay_") && calm_id != payment);
    assert_eq!(calm.location, Some(format!("/payments/{calm_id}")));
}

/// A gateway without idempotency keys (`--gateway-keys ignore`) charged the card, and the
/// demo was killed before the charge was recorded. The restarted demo's retry of the
/// payment: with `--authorise at-most-once` it finds the intent, asks the gateway for a
/// charge under the derived key, and resumes with it — one charge; with `at-least-once`
/// (no intent recorded, what the dedupe rests on turned off) it charges again — two.
async fn kill_9_between_the_gateway_call_and_its_record(
    server: Option<Server>,
    authorise: &'static str,
) {
    let place = Place::create(server).await;
    let client = reqwest::Client::new();
    let flags = ["--gateway-keys", "ignore", "--authorise", authorise];
    crash_at(&place, &client, "authorise-call", &flags, "lost-1").await;
    assert_eq!(payments_with(&place.effects(), "authorised").len(), 1);

    let (second, _) = place.start_with(None, "warn", &flags).await;
    let mut answer = post(&client, &second, "lost-1").await;
    for _ in 0..60 {
        if answer.status != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        answer = post(&client, &second, "lost-1").await;
    }
    assert_eq!(
        answer.status,
        StatusCode::CREATED,
        "{:?}",
        String::from_utf8_lossy(&answer.body)
    );
    let authorised = payments_with(&place.effects(), "authorised");
    match authorise {
        "at-most-once" => {
            assert_eq!(authorised.len(), 1, "charged once: {authorised:?}");
            assert_eq!(
                answer.json()["id"],
                authorised[0].as_str(),
                "the verified charge"
            );
        }
        _ => assert_eq!(
            authorised.len(),
            2,
            "without the intent the lost call is made again: {authorised:?}"
        ),
    }
}
