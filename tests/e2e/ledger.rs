//! The ledger demo (`idempotent_demo::ledger`, SQLite) and its Postgres and MySQL twins
//! (`ledger::postgres`, `ledger::mysql`): deposits and their stored
//! responses commit together; a crash between the write and the commit leaves nothing.
//!
//! The Postgres and MySQL tests need `IDEMPOTENT_TEST_POSTGRES_URL` /
//! `IDEMPOTENT_TEST_MYSQL_URL`; without them they are reported ignored.

/// The ledger example itself, so the tests drive the handler a reader sees.
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{Request, StatusCode};
use idempotent_demo::database::{self, Database};
use idempotent_demo::ledger;
use idempotent_runtime::Idempotency;
use idempotent_runtime::testing::{Trial, async_trial, ignored_if};

use crate::support::process::{Instance, Server, TestBackend};
use crate::support::send;

const LEDGER: &str = env!("CARGO_BIN_EXE_ledger-demo");

/// The ledger on the database at `url`, in-process: the example on SQLite, its twins on
/// Postgres and MySQL; and the database, to look behind the API.
async fn ledger_app(url: &str) -> (Router, Database) {
    let (db, store) = database::open(url).await.expect("open ledger database");
    let schema = match &db {
        #[cfg(feature = "mysql")]
        Database::MySql(_) => ledger::mysql::SCHEMA,
        _ => ledger::SCHEMA,
    };
    db.execute_script(schema).await.expect("ledger schema");
    let idempotency = Idempotency::builder_shared(store).build();
    let app = match &db {
        Database::Sqlite(pool) => ledger::router(ledger::AppState {
            idempotency,
            db: pool.clone(),
        }),
        #[cfg(feature = "postgres")]
        Database::Postgres(pool) => ledger::postgres::router(ledger::postgres::AppState {
            idempotency,
            db: pool.clone(),
        }),
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => ledger::mysql::router(ledger::mysql::AppState {
            idempotency,
            db: pool.clone(),
        }),
    };
    (app, db)
}

/// `GET /balance` as `api_key`.
async fn balance(app: &Router, api_key: &str) -> serde_json::Value {
    let answer = send(
        app,
        Request::get("/balance")
            .header("authorization", format!("Bearer {api_key}"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    answer.json()
}

fn balance_of(balance: i64, entries: i64) -> serde_json::Value {
    serde_json::json!({"balance": balance, "entries": entries})
}

fn deposit(key: &str, body: &str) -> Request<Body> {
    Request::post("/deposits")
        .header("authorization", "Bearer sk_test_alice")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

async fn deposits_commit_with_their_response(url: &str) {
    let (app, _) = ledger_app(url).await;
    let first = send(&app, deposit("d-1", r#"{"amount": 500}"#)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.json()["amount"], 500);
    let replay = send(&app, deposit("d-1", r#"{"amount": 500}"#)).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);

    let invalid = send(&app, deposit("d-2", r#"{"amount": 0}"#)).await;
    assert_eq!(invalid.status, StatusCode::BAD_REQUEST);
    let invalid_again = send(&app, deposit("d-2", r#"{"amount": 0}"#)).await;
    assert!(invalid_again.replayed(), "a 400 is committed and replayed");

    let garbage = send(&app, deposit("d-3", "{not json")).await;
    assert_eq!(garbage.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        garbage.header("content-type"),
        Some("application/problem+json")
    );
    let retried = send(&app, deposit("d-3", r#"{"amount": 0}"#)).await;
    assert!(!retried.replayed(), "the malformed body claimed nothing");

    assert_eq!(balance(&app, "sk_test_alice").await, balance_of(500, 1));
    assert_eq!(balance(&app, "sk_test_bob").await, balance_of(0, 0));
}

/// Deposits are capped, so a balance (the sum of an account's entries) stays a `BIGINT`:
/// two deposits near `i64::MAX` once made `GET /balance` a `500` (schemathesis found it).
async fn the_largest_deposits_keep_the_balance_answerable(url: &str) {
    let (app, _) = ledger_app(url).await;
    let max = idempotent_demo::ledger::MAX_DEPOSIT;
    for key in ["big-1", "big-2"] {
        let body = format!(r#"{{"amount": {max}}}"#);
        assert_eq!(
            send(&app, deposit(key, &body)).await.status,
            StatusCode::CREATED
        );
    }
    let over = format!(r#"{{"amount": {}}}"#, max + 1);
    let refused = send(&app, deposit("big-3", &over)).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    let near_max = format!(r#"{{"amount": {}}}"#, i64::MAX - 1);
    let refused = send(&app, deposit("big-4", &near_max)).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(balance(&app, "sk_test_alice").await, balance_of(2 * max, 2));
}

async fn fifty_duplicates_write_one_row(url: &str) {
    let (app, _) = ledger_app(url).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (app, barrier) = (app.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                send(&app, deposit("dup", r#"{"amount": 700}"#))
                    .await
                    .status
            })
        })
        .collect();
    for task in tasks {
        let status = task.await.unwrap();
        assert!(
            status == StatusCode::CREATED || status == StatusCode::CONFLICT,
            "status {status}"
        );
    }
    assert_eq!(balance(&app, "sk_test_alice").await, balance_of(700, 1));
}

async fn idempotency_state(db: &Database) -> Vec<String> {
    idempotent_demo::on_pool!(db, |pool| sqlx::query_scalar(
        "SELECT state FROM idempotency_records"
    )
    .fetch_all(pool)
    .await
    .unwrap())
}

/// A real OS process aborts after writing a deposit and before committing it.
async fn crash_between_write_and_commit(url: &str) {
    let flags = ["--lease", "2s"];
    let crashing = {
        let mut command = std::process::Command::new(LEDGER);
        command.env(ledger::CRASH_AFTER_WRITE_ENV, "1");
        Instance::start_command(command, url, &flags).await
    };
    let client = reqwest::Client::new();
    let post = |instance: &Instance| {
        client
            .post(instance.url("/deposits"))
            .header("authorization", "Bearer sk_test_alice")
            .header("idempotency-key", "crash-1")
            .header("content-type", "application/json")
            .body(r#"{"amount": 900}"#)
            .send()
    };
    assert!(
        post(&crashing).await.is_err(),
        "the process died mid-request"
    );
    drop(crashing);

    let (app, db) = ledger_app(url).await;
    assert_eq!(
        balance(&app, "sk_test_alice").await,
        balance_of(0, 0),
        "no ledger row"
    );
    assert_eq!(
        idempotency_state(&db).await,
        vec!["in_progress".to_owned()],
        "the claim is left in progress"
    );

    let healthy = Instance::start(LEDGER, url, &flags).await;
    let mut statuses = Vec::new();
    for _ in 0..60 {
        let response = post(&healthy).await.unwrap();
        statuses.push(response.status());
        if response.status() != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        statuses.last(),
        Some(&StatusCode::CREATED),
        "statuses {statuses:?}"
    );
    let replay = post(&healthy).await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(
        balance(&app, "sk_test_alice").await,
        balance_of(900, 1),
        "applied exactly once"
    );
}

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("ledger.db").display())
}

type Test = fn(String) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

/// Each ledger test, by name.
const TESTS: [(&str, Test); 4] = [
    ("deposits_commit_with_their_response", |url| {
        Box::pin(async move { deposits_commit_with_their_response(&url).await })
    }),
    ("the_largest_deposits_keep_the_balance_answerable", |url| {
        Box::pin(async move { the_largest_deposits_keep_the_balance_answerable(&url).await })
    }),
    ("fifty_duplicates_write_one_row", |url| {
        Box::pin(async move { fifty_duplicates_write_one_row(&url).await })
    }),
    ("crash_between_write_and_commit", |url| {
        Box::pin(async move { crash_between_write_and_commit(&url).await })
    }),
];

pub(crate) fn trials() -> Vec<Trial> {
    let mut trials: Vec<Trial> = TESTS
        .into_iter()
        .map(|(name, test)| {
            async_trial(format!("sqlite::{name}"), move || async move {
                let dir = tempfile::tempdir().unwrap();
                test(sqlite_url(&dir)).await;
            })
        })
        .collect();
    for server in [Server::Postgres, Server::MySql] {
        let on_server = TESTS
            .into_iter()
            .map(|(name, test)| {
                async_trial(format!("{}::{name}", server.name()), move || async move {
                    let backend = TestBackend::create(server, "ledger").await;
                    test(backend.url.clone()).await;
                })
            })
            .collect();
        trials.extend(ignored_if(server.unavailable(), on_server));
    }
    trials
}
