//! Leases on a real SQLite file whose write lock another connection holds: the
//! interleavings of issue 32 that SQLite's one writer makes possible, reproduced on the
//! system clock with real locks (each check takes a few seconds).
//!
//! - A transactional handler holding `BEGIN IMMEDIATE` starves the other requests'
//!   renewals; a retry of a live handler must still get `409`.
//! - Another connection holding the lock delays the answer of a claim past its lease; the
//!   late claim must not run.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use idempotent_runtime::store::SqliteStore;
use idempotent_runtime::testing::{Trial, async_trial};
use idempotent_runtime::{Fingerprint, HandlerConfig, Idempotency, Tx};
use sqlx::{Connection, SqliteConnection};
use tempfile::TempDir;

pub(crate) fn trials() -> Vec<Trial> {
    vec![
        async_trial(
            "leases::a_transaction_holding_the_write_lock_does_not_hand_a_live_key_to_a_retry",
            a_transaction_holding_the_write_lock_does_not_hand_a_live_key_to_a_retry,
        ),
        async_trial(
            "leases::without_a_transaction_a_retry_of_a_live_handler_gets_409",
            without_a_transaction_a_retry_of_a_live_handler_gets_409,
        ),
        async_trial(
            "leases::a_claim_answered_late_behind_another_connections_lock_does_not_run",
            a_claim_answered_late_behind_another_connections_lock_does_not_run,
        ),
    ]
}

const SCOPE: &str = "acct_alice";
const FINGERPRINT: Fingerprint = Fingerprint {
    version: 1,
    digest: [7; 32],
};

/// The plain handler's lease: short, so that a transaction holding the lock for two of
/// them is a few seconds.
const SHORT_LEASE: Duration = Duration::from_millis(1500);
const PLAIN: HandlerConfig = HandlerConfig::new().lease(SHORT_LEASE);
/// The transactional handler keeps a long lease: nobody retries it here.
const LEDGER: HandlerConfig = HandlerConfig::new().lease(Duration::from_secs(30));

async fn open(dir: &TempDir) -> (SqliteStore, String) {
    let path = dir.path().join("leases.db");
    let path = path.to_str().expect("utf-8 path").to_owned();
    let store = SqliteStore::open(&path).await.expect("open sqlite store");
    (store, path)
}

fn engine(store: SqliteStore) -> Idempotency {
    Idempotency::builder(store).replay_cache(None).build()
}

/// A plain request on key `p` whose handler counts its run (its side effect, at once)
/// and keeps working for `works`.
async fn plain(engine: &Idempotency, runs: &Arc<AtomicUsize>, works: Duration) -> Response {
    let runs = runs.clone();
    engine
        .run(&PLAIN, SCOPE, "p", FINGERPRINT, move |_key| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(works).await;
            (StatusCode::CREATED, "charged").into_response()
        })
        .await
}

/// Interleaving 2: a `Tx<Sqlite>` handler holds the write lock for twice the plain
/// handler's lease while that handler is still working; a retry of it must get `409`.
async fn a_transaction_holding_the_write_lock_does_not_hand_a_live_key_to_a_retry() {
    interleaving_two(true).await;
}

/// The control: the same requests without the transaction.
async fn without_a_transaction_a_retry_of_a_live_handler_gets_409() {
    interleaving_two(false).await;
}

async fn interleaving_two(with_transaction: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _path) = open(&dir).await;
    sqlx::query("CREATE TABLE ledger (account TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .expect("create the ledger");
    let engine = engine(store);
    let runs = Arc::new(AtomicUsize::new(0));
    let original = tokio::spawn({
        let (engine, runs) = (engine.clone(), runs.clone());
        async move { plain(&engine, &runs, Duration::from_millis(3600)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let ledger = with_transaction.then(|| {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .run_in_transaction::<sqlx::Sqlite, _, _, _, _>(
                    &LEDGER,
                    SCOPE,
                    "t",
                    FINGERPRINT,
                    |_key, mut tx: Tx<sqlx::Sqlite>| async move {
                        let written = sqlx::query("INSERT INTO ledger (account) VALUES ('a')")
                            .execute(tx.conn())
                            .await;
                        // Holds SQLite's write lock for two of the plain handler's leases.
                        tokio::time::sleep(SHORT_LEASE * 2).await;
                        let answer: Result<Response, Response> =
                            match written {
                                Ok(_) => Ok(StatusCode::CREATED.into_response()),
                                Err(e) => Err((StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
                                    .into_response()),
                            };
                        (answer, tx)
                    },
                )
                .await
        })
    });
    // The retry comes once the stored lease could have run out, shortly before the lock
    // frees, so its takeover (if the store lets it) is queued behind the lock.
    tokio::time::sleep(Duration::from_millis(2700)).await;
    let retry = plain(&engine, &runs, Duration::ZERO).await;
    assert_eq!(
        retry.status(),
        StatusCode::CONFLICT,
        "the retry of a live handler (runs: {})",
        runs.load(Ordering::SeqCst)
    );
    let first = original.await.expect("the original request");
    assert_eq!(first.status(), StatusCode::CREATED);
    if let Some(ledger) = ledger {
        assert_eq!(
            ledger.await.expect("the ledger").status(),
            StatusCode::CREATED
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    let replay = plain(&engine, &runs, Duration::ZERO).await;
    assert_eq!(
        replay.status(),
        StatusCode::CREATED,
        "the original's answer"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
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
