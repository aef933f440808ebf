//! Leases on a real SQLite file whose write lock another connection holds: the
//! interleavings of issue 32 that SQLite's one writer makes possible, reproduced on the
//! system clock with real locks (each check takes a few seconds).
//!
//! - Another connection holding the lock delays the answer of a claim past its lease; the
//!   late claim must not run.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::response::IntoResponse;
use http::StatusCode;
use idempotent_runtime::store::SqliteStore;
use idempotent_runtime::testing::{Trial, async_trial};
use idempotent_runtime::{Fingerprint, HandlerConfig, Idempotency};
use sqlx::{Connection, SqliteConnection};
use tempfile::TempDir;

pub(crate) fn trials() -> Vec<Trial> {
    vec![async_trial(
        "leases::a_claim_answered_late_behind_another_connections_lock_does_not_run",
        a_claim_answered_late_behind_another_connections_lock_does_not_run,
    )]
}

const SCOPE: &str = "acct_alice";
const FINGERPRINT: Fingerprint = Fingerprint {
    version: 1,
    digest: [7; 32],
};

async fn open(dir: &TempDir) -> (SqliteStore, String) {
    let path = dir.path().join("leases.db");
    let path = path.to_str().expect("utf-8 path").to_owned();
    let store = SqliteStore::open(&path).await.expect("open sqlite store");
    (store, path)
}

fn engine(store: SqliteStore) -> Idempotency {
    Idempotency::builder(store).replay_cache(None).build()
}

/// Interleaving 1 on a real lock: two stores (two engines) on one file, a third
/// connection holding `BEGIN IMMEDIATE` for 1.5 s. Engine A's claim waits behind it;
/// engine B's retry comes after A's 600 ms lease and waits too. Both are answered once
/// the lock frees, past their leases: neither runs (each answers `503` and releases),
/// and the client's next retry runs the handler once.
async fn a_claim_answered_late_behind_another_connections_lock_does_not_run() {
    const LEASE: Duration = Duration::from_millis(600);
    const SHORT: HandlerConfig = HandlerConfig::new().lease(LEASE);
    let dir = tempfile::tempdir().expect("tempdir");
    let (store_a, path) = open(&dir).await;
    let store_b = SqliteStore::open(&path).await.expect("a second store");
    let (a, b) = (engine(store_a), engine(store_b));
    let runs = Arc::new(AtomicUsize::new(0));
    let request = |engine: &Idempotency| {
        let (engine, runs) = (engine.clone(), runs.clone());
        async move {
            engine
                .run(&SHORT, SCOPE, "late", FINGERPRINT, move |_key| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // Keeps working past the other claim's answer.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    (StatusCode::CREATED, "charged").into_response()
                })
                .await
        }
    };
    let mut holder = SqliteConnection::connect(&format!("sqlite://{path}"))
        .await
        .expect("a third connection");
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut holder)
        .await
        .expect("take the write lock");
    let first = tokio::spawn(request(&a));
    tokio::time::sleep(LEASE + LEASE / 6).await;
    let retry = tokio::spawn(request(&b));
    tokio::time::sleep(Duration::from_millis(1500) - (LEASE + LEASE / 6)).await;
    sqlx::query("COMMIT")
        .execute(&mut holder)
        .await
        .expect("free the write lock");
    let (first, retry) = (first.await.expect("A"), retry.await.expect("B"));
    let ran = runs.load(Ordering::SeqCst);
    assert_eq!(
        ran,
        0,
        "a claim answered past its lease ran: {ran} run(s), A {}, B {}",
        first.status(),
        retry.status()
    );
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry.status(), StatusCode::SERVICE_UNAVAILABLE);
    let again = request(&b).await;
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}
