//! Recorded steps on a real SQLite file, as SQLite keeps them: one BLOB per record that
//! each step is appended to byte for byte, a release that keeps a record with steps ends
//! its lease on the boot clock, steps in a transaction, and a handler resuming in a store
//! reopened on the file.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use axum::response::{IntoResponse, Response};
use http::StatusCode;

use bytes::Bytes;
use idempotent_runtime::clock::ManualClock;
use idempotent_runtime::store::{
    ClaimOutcome, ClaimRequest, FencingToken, StoredResponse, Takeover,
};
use idempotent_runtime::store::{RecordedStep, SqliteStore, encode_step};
use idempotent_runtime::testing::{Trial, async_trial};
use idempotent_runtime::{
    Fingerprint, HandlerConfig, Idempotency, IdempotencyKey, RecordState, Store,
};
use sqlx::Row;
use tempfile::TempDir;

use super::{START, claim_request, path_in};

pub(crate) fn trials() -> Vec<Trial> {
    vec![
        async_trial(
            "steps::steps_are_one_blob_appended_byte_for_byte",
            steps_are_one_blob_appended_byte_for_byte,
        ),
        async_trial(
            "steps::a_release_that_keeps_the_record_ends_its_lease_on_the_boot_clock",
            a_release_that_keeps_the_record_ends_its_lease_on_the_boot_clock,
        ),
        async_trial(
            "steps::a_step_recorded_in_a_transaction_commits_or_rolls_back_with_it",
            a_step_recorded_in_a_transaction_commits_or_rolls_back_with_it,
        ),
        async_trial(
            "steps::the_schema_refuses_steps_on_a_completed_record",
            the_schema_refuses_steps_on_a_completed_record,
        ),
        async_trial(
            "steps::a_handler_resumes_after_its_steps_in_a_store_reopened_on_the_file",
            a_handler_resumes_after_its_steps_in_a_store_reopened_on_the_file,
        ),
    ]
}

const SCOPE: &str = "acct_alice";
const KEY: &str = "key-1";

/// A step whose output holds the bytes a text path would mangle: NUL, 0xFF, and an
/// invalid UTF-8 sequence.
fn step(name: &str, n: u8) -> RecordedStep {
    RecordedStep {
        name: name.to_owned(),
        output: Bytes::from(vec![0, 0xFF, n, 0xC3, 0x28, 0, b'}', n]),
        recorded_at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_000 + u64::from(n)),
    }
}

async fn open(dir: &TempDir, clock: &ManualClock) -> SqliteStore {
    SqliteStore::connect_with_clock(&path_in(dir, "steps.db"), Arc::new(clock.clone()))
        .await
        .expect("open")
}

async fn claim(store: &SqliteStore, token: FencingToken) -> ClaimOutcome {
    store.claim(&claim_request(token)).await.unwrap().outcome
}

/// The record's `steps` column and its SQLite type.
async fn steps_column(store: &SqliteStore) -> (Option<Vec<u8>>, String) {
    let row = sqlx::query(
        "SELECT steps, typeof(steps) FROM idempotency_records WHERE scope = ?1 AND key = ?2",
    )
    .bind(SCOPE)
    .bind(KEY)
    .fetch_one(store.pool())
    .await
    .unwrap();
    (row.get(0), row.get(1))
}

async fn steps_are_one_blob_appended_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at_millis(START);
    let store = open(&dir, &clock).await;
    let token = FencingToken::random();
    assert!(matches!(
        claim(&store, token).await,
        ClaimOutcome::Claimed { .. }
    ));
    assert_eq!(steps_column(&store).await, (None, "null".to_owned()));
    let steps = [step("authorise", 1), step("capture", 2), step("", 3)];
    let mut expected = Vec::new();
    for s in &steps {
        assert!(store.record_step(SCOPE, KEY, token, s).await.unwrap());
        expected.extend_from_slice(&encode_step(s));
        assert_eq!(
            steps_column(&store).await,
            (Some(expected.clone()), "blob".to_owned()),
            "after {:?}",
            s.name
        );
    }
    let info = store.inspect(SCOPE, KEY).await.unwrap().expect("live");
    assert_eq!(info.steps, steps);
    // Another token owns nothing: nothing is appended.
    assert!(
        !store
            .record_step(SCOPE, KEY, FencingToken::random(), &step("x", 4))
            .await
            .unwrap()
    );
    assert_eq!(steps_column(&store).await.0, Some(expected));
    let response = StoredResponse {
        status: 201,
        headers: Vec::new(),
        body: Some(Bytes::from_static(b"done")),
    };
    assert!(store.complete(SCOPE, KEY, token, &response).await.unwrap());
    assert_eq!(steps_column(&store).await, (None, "null".to_owned()));
    assert_eq!(store.inspect(SCOPE, KEY).await.unwrap().unwrap().steps, []);
    // Completed: the owner's token records nothing more.
    assert!(
        !store
            .record_step(SCOPE, KEY, token, &step("late", 5))
            .await
            .unwrap()
    );
}

async fn a_release_that_keeps_the_record_ends_its_lease_on_the_boot_clock() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at_millis(START);
    let store = open(&dir, &clock).await;
    let token = FencingToken::random();
    claim(&store, token).await;
    assert!(
        store
            .record_step(SCOPE, KEY, token, &step("a", 1))
            .await
            .unwrap()
    );
    // The wall clock is stepped away from the boot clock: the lease ends on the boot's.
    clock.advance(Duration::from_secs(3));
    clock.step_wall(-60_000);
    assert!(store.release(SCOPE, KEY, token).await.unwrap());
    let row = sqlx::query(
        "SELECT state, token, lease_expires_at, lease_boot_id, lease_ends_boot_ms \
         FROM idempotency_records",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(row.get::<String, _>(0), "in_progress");
    assert_eq!(row.get::<i64, _>(1), FencingToken::RELEASED.0);
    assert_eq!(row.get::<i64, _>(2), START + 3_000 - 60_000);
    assert_eq!(row.get::<Vec<u8>, _>(3), 1u128.to_be_bytes().to_vec());
    assert_eq!(row.get::<i64, _>(4), START + 3_000);
    let info = store.inspect(SCOPE, KEY).await.unwrap().expect("kept");
    assert!(matches!(
        info.state,
        RecordState::InProgress {
            holder_alive: false,
            ..
        }
    ));
    // The released token owns the kept record no more.
    assert!(!store.release(SCOPE, KEY, token).await.unwrap());
    assert!(
        !store
            .record_step(SCOPE, KEY, token, &step("b", 2))
            .await
            .unwrap()
    );
    let other = Fingerprint {
        version: 1,
        digest: [7; 32],
    };
    let mismatch = ClaimRequest {
        fingerprint: &other,
        ..claim_request(FencingToken::random())
    };
    assert_eq!(
        store.claim(&mismatch).await.unwrap().outcome,
        ClaimOutcome::Mismatch
    );
    let retry = FencingToken::random();
    assert_eq!(
        claim(&store, retry).await,
        ClaimOutcome::Claimed {
            token: retry,
            takeover: Some(Takeover::LeaseLost),
            steps: vec![step("a", 1)],
        }
    );
    // A record without steps is deleted by its release, as before steps.
    let bare = ClaimRequest {
        key: "key-2",
        ..claim_request(FencingToken::random())
    };
    store.claim(&bare).await.unwrap();
    assert!(store.release(SCOPE, "key-2", bare.token).await.unwrap());
    let left: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM idempotency_records WHERE key = 'key-2'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(left, 0);
    assert!(!store.release(SCOPE, "key-2", bare.token).await.unwrap());
}

async fn a_step_recorded_in_a_transaction_commits_or_rolls_back_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at_millis(START);
    let store = open(&dir, &clock).await;
    let tx_store = store
        .capabilities()
        .transactions
        .expect("transactions")
        .for_database::<sqlx::Sqlite>()
        .expect("a SQLite store");
    let token = FencingToken::random();
    claim(&store, token).await;
    let mut tx = tx_store.begin().await.unwrap();
    assert!(
        tx_store
            .record_step_in(&mut tx, SCOPE, KEY, token, &step("rolled back", 1))
            .await
            .unwrap()
    );
    tx.rollback().await.unwrap();
    assert_eq!(steps_column(&store).await.0, None);
    let mut tx = tx_store.begin().await.unwrap();
    assert!(
        tx_store
            .record_step_in(&mut tx, SCOPE, KEY, token, &step("kept", 2))
            .await
            .unwrap()
    );
    assert!(
        !tx_store
            .record_step_in(&mut tx, SCOPE, KEY, FencingToken::random(), &step("x", 3))
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
    let (bytes, kind) = steps_column(&store).await;
    assert_eq!(
        (bytes, kind.as_str()),
        (Some(encode_step(&step("kept", 2))), "blob")
    );
    // The store's own writer appends after the transaction's step.
    assert!(
        store
            .record_step(SCOPE, KEY, token, &step("after", 4))
            .await
            .unwrap()
    );
    assert_eq!(
        store.inspect(SCOPE, KEY).await.unwrap().unwrap().steps,
        [step("kept", 2), step("after", 4)]
    );
}

async fn the_schema_refuses_steps_on_a_completed_record() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at_millis(START);
    let store = open(&dir, &clock).await;
    let token = FencingToken::random();
    claim(&store, token).await;
    let response = StoredResponse {
        status: 200,
        headers: Vec::new(),
        body: None,
    };
    assert!(store.complete(SCOPE, KEY, token, &response).await.unwrap());
    let refused = sqlx::query("UPDATE idempotency_records SET steps = x'00'")
        .execute(store.pool())
        .await
        .expect_err("a completed record holds no steps");
    assert!(refused.to_string().contains("CHECK"), "{refused}");
}

/// How often each part of [`charge`] ran, across every store opened on the file.
#[derive(Debug, Default)]
struct Runs {
    authorise: AtomicUsize,
    receipt: AtomicUsize,
}

/// Authorises (a step), then answers `502` when `fail`, else sends the receipt (a step)
/// and answers `201`.
async fn charge(key: IdempotencyKey, runs: Arc<Runs>, fail: bool) -> Response {
    let authorised = key
        .step("authorise", || async {
            let n = runs.authorise.fetch_add(1, Ordering::SeqCst) + 1;
            Ok::<_, StatusCode>(format!("auth_{n}"))
        })
        .await;
    let authorisation = match authorised {
        Ok(authorisation) => authorisation,
        Err(error) => return error.into_response(),
    };
    if fail {
        return StatusCode::BAD_GATEWAY.into_response();
    }
    let sent = key
        .step("receipt", || async {
            runs.receipt.fetch_add(1, Ordering::SeqCst);
            Ok::<_, StatusCode>(())
        })
        .await;
    match sent {
        Ok(()) => (StatusCode::CREATED, authorisation).into_response(),
        Err(error) => error.into_response(),
    }
}

/// Through the engine: a released `5xx` keeps its recorded step in the file, and the
/// retry, served by a store opened anew on the file (as after a restart), resumes after
/// it instead of authorising again.
async fn a_handler_resumes_after_its_steps_in_a_store_reopened_on_the_file() {
    const CONFIG: HandlerConfig = HandlerConfig::new();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at_millis(START);
    let runs = Arc::new(Runs::default());
    let fingerprint = Fingerprint {
        version: 1,
        digest: [3; 32],
    };
    let run = |engine: Idempotency, fail: bool| {
        let runs = runs.clone();
        async move {
            engine
                .run(&CONFIG, SCOPE, KEY, fingerprint, move |key| {
                    charge(key, runs, fail)
                })
                .await
        }
    };
    let first = open(&dir, &clock).await;
    let answer = run(Idempotency::new(first.clone()), true).await;
    assert_eq!(answer.status(), StatusCode::BAD_GATEWAY);
    first.pool().close().await;
    drop(first);

    let second = open(&dir, &clock).await;
    let info = second.inspect(SCOPE, KEY).await.unwrap().expect("kept");
    let names: Vec<_> = info.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["authorise"]);
    let engine = Idempotency::new(second.clone());
    let answer = run(engine.clone(), false).await;
    assert_eq!(answer.status(), StatusCode::CREATED);
    assert_eq!(
        runs.authorise.load(Ordering::SeqCst),
        1,
        "resumed, not rerun"
    );
    assert_eq!(runs.receipt.load(Ordering::SeqCst), 1);
    let replay = run(engine, false).await;
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(steps_column(&second).await, (None, "null".to_owned()));
}
