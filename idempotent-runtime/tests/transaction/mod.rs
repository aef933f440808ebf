//! The transactional unit of work (DESIGN §5), checked on every SQL store through its
//! conformance [`Harness`]: business writes and the stored response commit together, or
//! not at all.
#![allow(dead_code)] // each test file uses the checks of its own backend

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use idempotent_runtime::store::SqlPool;
use idempotent_runtime::transaction::TxDatabase;
use idempotent_runtime::{
    ClaimOutcome, ClaimRequest, FencingToken, Fingerprint, HandlerConfig, Idempotency, Tx,
};

use crate::conformance::Harness;

/// Ledger statements on one database; the same SQL (`$N` placeholders) on each.
#[async_trait::async_trait]
pub trait Ledger: TxDatabase {
    async fn insert(tx: &mut Tx<Self>, account: &str) -> Result<(), sqlx::Error>;
}

const INSERT: &str = "INSERT INTO test_ledger (account) VALUES ($1)";
const CREATE: &str = "CREATE TABLE IF NOT EXISTS test_ledger (account TEXT NOT NULL)";
const COUNT: &str = "SELECT COUNT(*) FROM test_ledger";

#[cfg(feature = "sqlite")]
#[async_trait::async_trait]
impl Ledger for sqlx::Sqlite {
    async fn insert(tx: &mut Tx<Self>, account: &str) -> Result<(), sqlx::Error> {
        sqlx::query(INSERT)
            .bind(account.to_owned())
            .execute(tx.conn())
            .await
            .map(drop)
    }
}

#[cfg(feature = "postgres")]
#[async_trait::async_trait]
impl Ledger for sqlx::Postgres {
    async fn insert(tx: &mut Tx<Self>, account: &str) -> Result<(), sqlx::Error> {
        sqlx::query(INSERT)
            .bind(account.to_owned())
            .execute(tx.conn())
            .await
            .map(drop)
    }
}

async fn on_pool(pool: &SqlPool, sql: &'static str) -> i64 {
    match pool {
        #[cfg(feature = "sqlite")]
        SqlPool::Sqlite(pool) => {
            if sql.starts_with("SELECT") {
                sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
            } else {
                sqlx::query(sql)
                    .execute(pool)
                    .await
                    .unwrap()
                    .rows_affected() as i64
            }
        }
        #[cfg(feature = "postgres")]
        SqlPool::Postgres(pool) => {
            if sql.starts_with("SELECT") {
                sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
            } else {
                sqlx::query(sql)
                    .execute(pool)
                    .await
                    .unwrap()
                    .rows_affected() as i64
            }
        }
        #[allow(unreachable_patterns)]
        _ => unreachable!("an SQL store"),
    }
}

struct Setup<H> {
    harness: H,
    engine: Idempotency,
    pool: SqlPool,
    runs: Arc<AtomicUsize>,
}

impl<H: Harness> Setup<H> {
    async fn rows(&self) -> i64 {
        on_pool(&self.pool, COUNT).await
    }
}

async fn setup<H: Harness>() -> Option<Setup<H>> {
    let harness = H::new().await?;
    let store = harness.store();
    let pool = store.sql_pool().expect("an SQL store");
    on_pool(&pool, CREATE).await;
    Some(Setup {
        engine: Idempotency::builder_shared(store).build(),
        harness,
        pool,
        runs: Arc::default(),
    })
}

const CONFIG: HandlerConfig = HandlerConfig::new();
const FINGERPRINT: Fingerprint = Fingerprint {
    version: 1,
    digest: [9; 32],
};

/// What the test handler does after writing its ledger row.
#[derive(Clone, Copy, Debug)]
enum Then {
    Created,
    Err,
    ServerError,
    Panic,
}

async fn deposit<H: Harness, DB: Ledger>(setup: &Setup<H>, key: &str, then: Then) -> Response {
    let runs = setup.runs.clone();
    setup
        .engine
        .run_in_transaction::<DB, _, _, _, _>(
            &CONFIG,
            "acct_alice",
            key,
            FINGERPRINT,
            move |_key, mut tx| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let written = DB::insert(&mut tx, "acct_alice").await;
                let result: Result<Response, Response> = match (written, then) {
                    (Err(err), _) => {
                        Err((StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response())
                    }
                    (Ok(()), Then::Created) => {
                        Ok((StatusCode::CREATED, "deposited").into_response())
                    }
                    (Ok(()), Then::Err) => {
                        Err((StatusCode::BAD_REQUEST, "refused after writing").into_response())
                    }
                    (Ok(()), Then::ServerError) => Ok(StatusCode::BAD_GATEWAY.into_response()),
                    (Ok(()), Then::Panic) => panic!("handler bug after writing"),
                };
                (result, tx)
            },
        )
        .await
}

pub async fn check_commit_together_and_replay<H: Harness, DB: Ledger>() {
    let Some(setup) = setup::<H>().await else {
        return;
    };
    let first = deposit::<H, DB>(&setup, "k", Then::Created).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(setup.rows().await, 1);
    let again = deposit::<H, DB>(&setup, "k", Then::Created).await;
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(setup.runs.load(Ordering::SeqCst), 1);
    assert_eq!(setup.rows().await, 1);
}

pub async fn check_concurrent_duplicates_write_once<H: Harness, DB: Ledger>() {
    let Some(setup) = setup::<H>().await else {
        return;
    };
    let setup = Arc::new(setup);
    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (setup, barrier) = (setup.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                deposit::<H, DB>(&setup, "dup", Then::Created)
                    .await
                    .status()
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
    assert_eq!(setup.rows().await, 1, "one ledger row");
    assert_eq!(setup.runs.load(Ordering::SeqCst), 1);
}

pub async fn check_failures_roll_back_and_release<H: Harness, DB: Ledger>() {
    let Some(setup) = setup::<H>().await else {
        return;
    };
    for (key, then, status) in [
        ("err", Then::Err, StatusCode::BAD_REQUEST),
        ("5xx", Then::ServerError, StatusCode::BAD_GATEWAY),
        ("panic", Then::Panic, StatusCode::INTERNAL_SERVER_ERROR),
    ] {
        let failed = deposit::<H, DB>(&setup, key, then).await;
        assert_eq!(failed.status(), status, "{then:?}");
        assert_eq!(setup.rows().await, 0, "{then:?}: the write rolled back");
        let retry = deposit::<H, DB>(&setup, key, Then::Created).await;
        assert_eq!(
            retry.status(),
            StatusCode::CREATED,
            "{then:?}: released, the retry runs"
        );
        assert!(retry.headers().get("idempotent-replayed").is_none());
        assert_eq!(setup.rows().await, 1, "{then:?}: applied once");
        on_pool(&setup.pool, "DELETE FROM test_ledger").await;
    }
}

pub async fn check_stale_owner_cannot_commit<H: Harness, DB: Ledger>() {
    let Some(setup) = setup::<H>().await else {
        return;
    };
    let harness = Arc::new(setup.harness);
    let store = harness.store();
    let new_owner = Arc::new(std::sync::Mutex::new(None));
    let response = {
        let (harness, store, new_owner) = (harness.clone(), store.clone(), new_owner.clone());
        setup
            .engine
            .run_in_transaction::<DB, _, _, _, _>(
                &CONFIG,
                "acct_alice",
                "stale",
                FINGERPRINT,
                move |_key, mut tx| async move {
                    // The lease runs out (a stalled owner) and a retry takes the key over.
                    harness.advance(Duration::from_secs(31)).await;
                    let token = FencingToken::random();
                    let outcome = store
                        .try_claim(&ClaimRequest {
                            scope: "acct_alice",
                            key: "stale",
                            fingerprint: &FINGERPRINT,
                            ttl: Duration::from_secs(3600),
                            lease: Duration::from_secs(30),
                            token,
                        })
                        .await
                        .unwrap();
                    assert_eq!(outcome, ClaimOutcome::Claimed { token });
                    *new_owner.lock().unwrap() = Some(token);
                    // The stale owner writes anyway and tries to commit.
                    DB::insert(&mut tx, "acct_alice").await.unwrap();
                    (Ok::<_, Response>(StatusCode::CREATED.into_response()), tx)
                },
            )
            .await
    };
    assert_eq!(response.status(), StatusCode::CONFLICT, "fenced out");
    let pool = setup.pool;
    assert_eq!(
        on_pool(&pool, COUNT).await,
        0,
        "the stale owner's write rolled back"
    );
    let token = new_owner.lock().unwrap().expect("taken over");
    let stored = idempotent_runtime::StoredResponse {
        status: 201,
        headers: vec![],
        body: Some("new".into()),
    };
    assert!(
        store
            .complete("acct_alice", "stale", token, &stored)
            .await
            .unwrap(),
        "the new owner still owns the key"
    );
}

pub async fn check_store_of_another_database_is_refused<H: Harness, DB: Ledger>() {
    let Some(setup) = setup::<H>().await else {
        return;
    };
    let memory = Idempotency::new(idempotent_runtime::store::MemoryStore::new());
    assert!(!memory.supports_transactions::<DB>());
    assert!(setup.engine.supports_transactions::<DB>());
    let refused = memory
        .run_in_transaction::<DB, _, _, _, _>(
            &CONFIG,
            "acct_alice",
            "k",
            FINGERPRINT,
            |_key, _tx: Tx<DB>| async move {
                panic!("must not run");
                #[allow(unreachable_code)]
                (Ok::<StatusCode, StatusCode>(StatusCode::OK), _tx)
            },
        )
        .await;
    assert_eq!(refused.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = http_body_util::BodyExt::collect(refused.into_body())
        .await
        .unwrap()
        .to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["code"], "transaction_unsupported");
}

/// Expands to one `#[tokio::test]` per transactional check for `$harness` on `$db`.
#[macro_export]
macro_rules! transaction_suite {
    ($harness:ty, $db:ty) => {
        $crate::transaction_suite!(@tests $harness, $db;
            check_commit_together_and_replay,
            check_concurrent_duplicates_write_once,
            check_failures_roll_back_and_release,
            check_stale_owner_cannot_commit,
            check_store_of_another_database_is_refused,
        );
    };
    (@tests $harness:ty, $db:ty; $($check:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $check() {
                $crate::transaction::$check::<$harness, $db>().await;
            }
        )+
    };
}
