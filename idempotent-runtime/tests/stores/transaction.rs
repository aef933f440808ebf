//! The transactional unit of work, checked on every SQL store through its
//! conformance [`Harness`]: business writes and the stored response commit together, or
//! not at all.
#![allow(dead_code)] // each store module uses the checks of its own backend, and a build may leave a store out

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use idempotent_runtime::engine::Failure;
use idempotent_runtime::store::{ClaimAnswer, Forward};
use idempotent_runtime::store::{
    ClaimOutcome, ClaimRequest, FencingToken, StoredResponse, Takeover, TxSupport,
};
use idempotent_runtime::transaction::{TxDatabase, TxStore};
use idempotent_runtime::{Fingerprint, HandlerConfig, Idempotency, Outcome, Store, StoreError, Tx};

use idempotent_runtime::testing::conformance::Harness;
use idempotent_runtime::testing::{self, Trial, async_trial, ignored_if};

/// Ledger statements on one database; the same SQL (`$N` placeholders, rewritten for
/// MySQL) on each.
#[async_trait::async_trait]
pub(crate) trait Ledger: TxDatabase {
    async fn insert(tx: &mut Tx<Self>, account: &str) -> Result<(), sqlx::Error>;
    async fn count(tx: &mut Tx<Self>) -> Result<i64, sqlx::Error>;
    /// Runs `sql` outside the engine: a `SELECT`'s single value, or the rows affected.
    async fn run(conn: &mut Self::Connection, sql: &'static str) -> Result<i64, sqlx::Error>;
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

    async fn count(tx: &mut Tx<Self>) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(COUNT).fetch_one(tx.conn()).await
    }

    async fn run(conn: &mut Self::Connection, sql: &'static str) -> Result<i64, sqlx::Error> {
        if sql.starts_with("SELECT") {
            sqlx::query_scalar(sql).fetch_one(conn).await
        } else {
            let done = sqlx::query(sql).execute(conn).await?;
            Ok(i64::try_from(done.rows_affected()).expect("a test-sized count"))
        }
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

    async fn count(tx: &mut Tx<Self>) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(COUNT).fetch_one(tx.conn()).await
    }

    async fn run(conn: &mut Self::Connection, sql: &'static str) -> Result<i64, sqlx::Error> {
        if sql.starts_with("SELECT") {
            sqlx::query_scalar(sql).fetch_one(conn).await
        } else {
            let done = sqlx::query(sql).execute(conn).await?;
            Ok(i64::try_from(done.rows_affected()).expect("a test-sized count"))
        }
    }
}

/// MySQL's placeholders are `?`: the shared statements' `$N`, rewritten.
#[cfg(feature = "mysql")]
fn mysql_dialect(sql: &str) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(sql.replace("$1", "?"))
}

#[cfg(feature = "mysql")]
#[async_trait::async_trait]
impl Ledger for sqlx::MySql {
    async fn insert(tx: &mut Tx<Self>, account: &str) -> Result<(), sqlx::Error> {
        sqlx::query(mysql_dialect(INSERT))
            .bind(account.to_owned())
            .execute(tx.conn())
            .await
            .map(drop)
    }

    async fn count(tx: &mut Tx<Self>) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(mysql_dialect(COUNT))
            .fetch_one(tx.conn())
            .await
    }

    async fn run(conn: &mut Self::Connection, sql: &'static str) -> Result<i64, sqlx::Error> {
        if sql.starts_with("SELECT") {
            sqlx::query_scalar(mysql_dialect(sql)).fetch_one(conn).await
        } else {
            let done = sqlx::query(mysql_dialect(sql)).execute(conn).await?;
            Ok(i64::try_from(done.rows_affected()).expect("a test-sized count"))
        }
    }
}

/// Runs `sql` in a transaction of its own on the store's database, through the store's
/// own transactional handle (the one the engine uses).
async fn on_db<DB: Ledger>(tx_store: &Arc<dyn TxStore<DB>>, sql: &'static str) -> i64 {
    let mut tx = tx_store.begin().await.expect("begin");
    let result = DB::run(&mut tx, sql).await.expect(sql);
    tx.commit().await.expect("commit");
    result
}

struct Setup<H, DB: Ledger> {
    harness: H,
    engine: Idempotency,
    tx_store: Arc<dyn TxStore<DB>>,
    runs: Arc<AtomicUsize>,
}

impl<H: Harness, DB: Ledger> Setup<H, DB> {
    async fn rows(&self) -> i64 {
        on_db(&self.tx_store, COUNT).await
    }
}

async fn setup<H: Harness, DB: Ledger>() -> Setup<H, DB> {
    let harness = H::new().await;
    let store = harness.store();
    let support: TxSupport = store.capabilities().transactions.expect("an SQL store");
    let tx_store = support
        .for_database::<DB>()
        .unwrap_or_else(|| panic!("a {} store", DB::DATABASE_NAME));
    on_db(&tx_store, CREATE).await;
    Setup {
        engine: Idempotency::builder_shared(store).build(),
        harness,
        tx_store,
        runs: Arc::default(),
    }
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

async fn deposit<H: Harness, DB: Ledger>(setup: &Setup<H, DB>, key: &str, then: Then) -> Response {
    let runs = setup.runs.clone();
    setup
        .engine
        .run_in_transaction::<DB, _, _, _>(
            &CONFIG,
            "acct_alice",
            key,
            FINGERPRINT,
            async move |_key, tx: &mut Tx<DB>| {
                runs.fetch_add(1, Ordering::SeqCst);
                let written = DB::insert(tx, "acct_alice").await;
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
                    (Ok(()), Then::Panic) => {
                        testing::panic_deliberately("handler bug after writing")
                    }
                };
                result
            },
        )
        .await
}

pub(crate) async fn check_commit_together_and_replay<H: Harness, DB: Ledger>() {
    let setup = setup::<H, DB>().await;
    let first = deposit::<H, DB>(&setup, "k", Then::Created).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(setup.rows().await, 1);
    let again = deposit::<H, DB>(&setup, "k", Then::Created).await;
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(setup.runs.load(Ordering::SeqCst), 1);
    assert_eq!(setup.rows().await, 1);
}

pub(crate) async fn check_concurrent_duplicates_write_once<H: Harness, DB: Ledger>() {
    let setup = setup::<H, DB>().await;
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

pub(crate) async fn check_failures_roll_back_and_release<H: Harness, DB: Ledger>() {
    let setup = setup::<H, DB>().await;
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
        on_db(&setup.tx_store, "DELETE FROM test_ledger").await;
    }
}

/// A handler that reads before it writes, while another connection commits a write in
/// between (here an unrelated insert; in production, e.g. the request's own heartbeat
/// renewing its lease). On SQLite a deferred `BEGIN` fails that handler's first write with
/// `SQLITE_BUSY_SNAPSHOT`, at once; the engine's `BEGIN IMMEDIATE` holds the write lock
/// from the start, so the other writer waits for the handler's commit instead.
pub(crate) async fn check_read_then_write_beside_other_commits<H: Harness, DB: Ledger>() {
    let setup = setup::<H, DB>().await;
    on_db(&setup.tx_store, CREATE_OTHER).await;
    let read = Arc::new(tokio::sync::Notify::new());
    let (written_tx, written_rx) = tokio::sync::oneshot::channel::<()>();
    // The other writer: commits as soon as the handler has read (on SQLite with
    // `BEGIN IMMEDIATE`, only once the handler committed).
    let writer = {
        let (tx_store, read) = (setup.tx_store.clone(), read.clone());
        tokio::spawn(async move {
            read.notified().await;
            on_db(&tx_store, INSERT_OTHER).await;
            let _ = written_tx.send(());
        })
    };
    let response = setup
        .engine
        .run_in_transaction::<DB, _, _, _>(
            &CONFIG,
            "acct_alice",
            "read-then-write",
            FINGERPRINT,
            async move |_key, tx: &mut Tx<DB>| {
                let before = DB::count(tx).await;
                read.notify_one();
                // Give the other writer time to commit; never wait for it to finish
                // (on SQLite it waits for this transaction).
                let _ = tokio::time::timeout(Duration::from_millis(500), written_rx).await;
                match (before, DB::insert(tx, "acct_alice").await) {
                    (Ok(0), Ok(())) => Ok((StatusCode::CREATED, "deposited").into_response()),
                    (before, written) => Err((
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("read {before:?}, then write {written:?}"),
                    )
                        .into_response()),
                }
            },
        )
        .await;
    let status = response.status();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(
        status,
        StatusCode::CREATED,
        "read-then-write handler failed: {}",
        String::from_utf8_lossy(&body)
    );
    tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the other writer finishes once the handler committed")
        .expect("the other writer's insert succeeds");
    assert_eq!(setup.rows().await, 1, "the handler's write committed");
    assert_eq!(
        on_db(&setup.tx_store, COUNT_OTHER).await,
        1,
        "and so did the other"
    );
}

const CREATE_OTHER: &str = "CREATE TABLE IF NOT EXISTS test_other (note TEXT NOT NULL)";
const INSERT_OTHER: &str = "INSERT INTO test_other (note) VALUES ('committed meanwhile')";
const COUNT_OTHER: &str = "SELECT COUNT(*) FROM test_other";

/// A store that forwards everything to `inner` (its capabilities too, so transactional
/// handlers run on it like on `inner`), except that its first claim is taken over before
/// the engine even sees it: the claim succeeds with the caller's token, then the lease
/// runs out (a stalled owner) and a retry claims the key with a new token. The engine
/// thus runs the handler with a stale token from the start.
struct TakenOverOnFirstClaim<H> {
    inner: Arc<dyn Store>,
    harness: Arc<H>,
    new_owner: std::sync::Mutex<Option<FencingToken>>,
}

impl<H> std::fmt::Debug for TakenOverOnFirstClaim<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TakenOverOnFirstClaim")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl<H: Harness> Forward for TakenOverOnFirstClaim<H> {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn claim(&self, claim: &ClaimRequest<'_>) -> Result<ClaimAnswer, StoreError> {
        let answer = self.inner.claim(claim).await?;
        if self.new_owner.lock().unwrap().is_some() {
            return Ok(answer);
        }
        assert_eq!(
            answer.outcome,
            ClaimOutcome::Claimed {
                token: claim.token,
                takeover: None,
                steps: Vec::new(),
            }
        );
        self.harness
            .advance(claim.lease + Duration::from_secs(1))
            .await;
        let token = FencingToken::random();
        let retry = self.inner.claim(&ClaimRequest { token, ..*claim }).await?;
        assert_eq!(
            retry.outcome,
            ClaimOutcome::Claimed {
                token,
                takeover: Some(Takeover::LeaseLost),
                steps: Vec::new(),
            },
            "the retry took over"
        );
        *self.new_owner.lock().unwrap() = Some(token);
        Ok(answer)
    }
}

/// An owner whose lease was taken over cannot commit: its writes roll back, the answer
/// is `409`, and the new owner keeps the record. The store is a decorator (see
/// [`TakenOverOnFirstClaim`]), so this also checks that transactional handlers work on a
/// store that merely forwards its capabilities.
pub(crate) async fn check_stale_owner_cannot_commit<H: Harness, DB: Ledger>() {
    let Setup {
        harness, tx_store, ..
    } = setup::<H, DB>().await;
    let harness = Arc::new(harness);
    let inner = harness.store();
    let store = Arc::new(TakenOverOnFirstClaim {
        inner: inner.clone(),
        harness: harness.clone(),
        new_owner: std::sync::Mutex::new(None),
    });
    let engine = Idempotency::builder_shared(store.clone()).build();
    assert!(
        engine.supports_transactions::<DB>(),
        "transactions() forwarded"
    );
    let response = engine
        .run_in_transaction::<DB, _, _, _>(
            &CONFIG,
            "acct_alice",
            "stale",
            FINGERPRINT,
            async move |_key, tx: &mut Tx<DB>| {
                // The stale owner writes and tries to commit.
                DB::insert(tx, "acct_alice").await.unwrap();
                Ok::<_, Response>(StatusCode::CREATED.into_response())
            },
        )
        .await;
    assert_eq!(response.status(), StatusCode::CONFLICT, "fenced out");
    assert_eq!(
        on_db(&tx_store, COUNT).await,
        0,
        "the stale owner's write rolled back"
    );
    let token = store.new_owner.lock().unwrap().expect("taken over");
    let stored = StoredResponse {
        status: 201,
        headers: vec![],
        body: Some("new".into()),
    };
    assert!(
        inner
            .complete("acct_alice", "stale", token, &stored)
            .await
            .unwrap(),
        "the new owner still owns the key"
    );
}

pub(crate) async fn check_store_of_another_database_is_refused<H: Harness, DB: Ledger>() {
    let setup = setup::<H, DB>().await;
    let memory = Idempotency::new(idempotent_runtime::store::MemoryStore::new());
    assert!(!memory.supports_transactions::<DB>());
    assert!(setup.engine.supports_transactions::<DB>());
    let refused = memory
        .run_in_transaction::<DB, _, _, _>(
            &CONFIG,
            "acct_alice",
            "k",
            FINGERPRINT,
            async move |_key, _tx: &mut Tx<DB>| {
                panic!("must not run");
                #[allow(unreachable_code)]
                Ok::<StatusCode, StatusCode>(StatusCode::OK)
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

/// Every transactional check for backend `H` on database `DB`, one test each (named
/// `transaction::check_…`), ignored when the harness says its backend is unavailable.
/// A plain handler of three steps: `authorise` (external, counted), `ledger` (an atomic
/// step writing one row), `receipt` (external, counted). `fail_after` names the step
/// after which the first execution answers `502` (released, steps kept).
async fn three_steps<H: Harness, DB: Ledger>(
    setup: &Setup<H, DB>,
    key: &str,
    fail_after: Option<&'static str>,
    receipts: &Arc<AtomicUsize>,
) -> Response {
    let (runs, receipts) = (setup.runs.clone(), receipts.clone());
    let first = setup.runs.load(Ordering::SeqCst) == 0;
    setup
        .engine
        .run(
            &CONFIG,
            "acct_alice",
            key,
            FINGERPRINT,
            move |key| async move {
                let fail = |after| first && fail_after == Some(after);
                let authorised = key
                    .step("authorise", || async {
                        Ok::<_, StatusCode>(runs.fetch_add(1, Ordering::SeqCst) + 1)
                    })
                    .await;
                let authorisation = match authorised {
                    Ok(authorisation) => authorisation,
                    Err(error) => return error.into_response(),
                };
                if fail("authorise") {
                    return StatusCode::BAD_GATEWAY.into_response();
                }
                let ledger = key
                    .atomic_step("ledger", async |tx: &mut Tx<DB>| {
                        let written = DB::insert(tx, "acct_alice").await;
                        written.map(|()| 7u32).map_err(|e| e.to_string())
                    })
                    .await;
                if let Err(error) = ledger {
                    return (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response();
                }
                if fail("ledger") {
                    return StatusCode::BAD_GATEWAY.into_response();
                }
                let sent = key
                    .step("receipt", || async {
                        Ok::<_, StatusCode>(receipts.fetch_add(1, Ordering::SeqCst) + 1)
                    })
                    .await;
                match sent {
                    Ok(receipt) => (
                        StatusCode::CREATED,
                        format!("authorisation {authorisation}, receipt {receipt}"),
                    )
                        .into_response(),
                    Err(error) => error.into_response(),
                }
            },
        )
        .await
}

/// A released execution resumes after its recorded steps, the atomic one included: one
/// authorisation, one ledger row, one receipt, whichever step the first run stopped after.
pub(crate) async fn check_atomic_steps_resume_exactly_once<H: Harness, DB: Ledger>() {
    let setup = setup::<H, DB>().await;
    for (round, fail_after) in ["authorise", "ledger"].into_iter().enumerate() {
        let key = format!("steps-{fail_after}");
        setup.runs.store(0, Ordering::SeqCst);
        let receipts = Arc::new(AtomicUsize::new(0));
        let first = three_steps::<H, DB>(&setup, &key, Some(fail_after), &receipts).await;
        assert_eq!(first.status(), StatusCode::BAD_GATEWAY, "{fail_after}");
        let retry = three_steps::<H, DB>(&setup, &key, Some(fail_after), &receipts).await;
        assert_eq!(retry.status(), StatusCode::CREATED, "{fail_after}");
        let body = http_body_util::BodyExt::collect(retry.into_body())
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(&body[..], b"authorisation 1, receipt 1", "{fail_after}");
        assert_eq!(
            setup.runs.load(Ordering::SeqCst),
            1,
            "{fail_after}: one authorisation"
        );
        assert_eq!(
            receipts.load(Ordering::SeqCst),
            1,
            "{fail_after}: one receipt"
        );
        assert_eq!(
            setup.rows().await,
            round as i64 + 1,
            "{fail_after}: one ledger row per key"
        );
    }
}

/// An atomic step whose own result is `Err` rolls its writes back and records nothing;
/// one whose claim was taken away (an operator's forced forget) rolls back too, and
/// answers `LeaseLost`.
pub(crate) async fn check_atomic_step_rolls_back_unless_recorded<H: Harness, DB: Ledger>() {
    let setup = setup::<H, DB>().await;
    let failed = setup
        .engine
        .run(
            &CONFIG,
            "acct_alice",
            "atomic-err",
            FINGERPRINT,
            |key| async move {
                let result = key
                    .atomic_step("ledger", async |tx: &mut Tx<DB>| {
                        DB::insert(tx, "acct_alice").await.expect("insert");
                        Err::<u32, _>(StatusCode::CONFLICT)
                    })
                    .await;
                match result {
                    Err(error @ idempotent_runtime::StepError::Failed(_)) => error.into_response(),
                    other => panic!("{other:?}"),
                }
            },
        )
        .await;
    assert_eq!(failed.status(), StatusCode::CONFLICT);
    assert_eq!(setup.rows().await, 0, "the step's write rolled back");

    let engine = setup.engine.clone();
    let lost = setup
        .engine
        .run(
            &CONFIG,
            "acct_alice",
            "atomic-lost",
            FINGERPRINT,
            move |key| async move {
                let forgotten = engine.forget("acct_alice", "atomic-lost", true).await;
                assert!(forgotten.is_ok(), "{forgotten:?}");
                let result = key
                    .atomic_step("ledger", async |tx: &mut Tx<DB>| {
                        DB::insert(tx, "acct_alice").await.expect("insert");
                        Ok::<u32, StatusCode>(1)
                    })
                    .await;
                match result {
                    Err(error @ idempotent_runtime::StepError::LeaseLost { .. }) => {
                        error.into_response()
                    }
                    other => panic!("{other:?}"),
                }
            },
        )
        .await;
    assert_eq!(lost.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        setup.rows().await,
        0,
        "a step of a lost claim commits nothing"
    );
}

/// A transactional handler's writes already commit with its response: a step inside one
/// is refused, and the refusal rolls its writes back like any `Err`.
pub(crate) async fn check_steps_refused_inside_a_transactional_handler<H: Harness, DB: Ledger>() {
    let setup = setup::<H, DB>().await;
    let response = setup
        .engine
        .run_in_transaction::<DB, _, _, _>(
            &CONFIG,
            "acct_alice",
            "inside",
            FINGERPRINT,
            async move |key, tx: &mut Tx<DB>| {
                DB::insert(tx, "acct_alice").await.expect("insert");
                let step = key
                    .step("authorise", || async { Ok::<_, StatusCode>(1u32) })
                    .await;
                let result: Result<Response, Response> = match step {
                    Err(error @ idempotent_runtime::StepError::InsideTransaction { .. }) => {
                        Err(error.into_response())
                    }
                    other => panic!("{other:?}"),
                };
                result
            },
        )
        .await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(setup.rows().await, 0);
}

/// No other step runs while an atomic step's transaction is open (on SQLite its record
/// would wait for the write lock that transaction holds): a step nested in it is refused,
/// and the atomic step still commits.
pub(crate) async fn check_steps_refused_inside_an_atomic_step<H: Harness, DB: Ledger>() {
    let setup = setup::<H, DB>().await;
    let response = setup
        .engine
        .run(
            &CONFIG,
            "acct_alice",
            "nested",
            FINGERPRINT,
            |key| async move {
                let outer = key
                    .atomic_step("ledger", async |tx: &mut Tx<DB>| {
                        DB::insert(tx, "acct_alice").await.expect("insert");
                        let nested = key
                            .step("receipt", || async { Ok::<_, StatusCode>(1u32) })
                            .await;
                        let refused = matches!(
                            nested,
                            Err(idempotent_runtime::StepError::InsideTransaction { .. })
                        );
                        Ok::<bool, StatusCode>(refused)
                    })
                    .await;
                match outer {
                    Ok(true) => StatusCode::CREATED.into_response(),
                    other => panic!("{other:?}"),
                }
            },
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(setup.rows().await, 1);
}

/// What the inbox function does after writing its ledger row.
async fn inbox<H: Harness, DB: Ledger>(
    setup: &Setup<H, DB>,
    key: &str,
    then: Then,
) -> Outcome<(String, i64), String> {
    // Duplicates wait for the original, so that each of them settles.
    const WAITING: HandlerConfig = CONFIG.wait(Duration::from_secs(20));
    let runs = setup.runs.clone();
    setup
        .engine
        .once_in_transaction(
            &WAITING,
            "inbox",
            key,
            Fingerprint::of_payload(b"deposit 100"),
            async move |key, tx: &mut Tx<DB>| {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let written = DB::insert(tx, key.as_str()).await;
                match (written, then) {
                    (Err(err), _) => Err(err.to_string()),
                    (Ok(()), Then::Created) => Ok((key.as_str().to_owned(), run as i64)),
                    (Ok(()), Then::Err | Then::ServerError) => Err("refused after writing".into()),
                    (Ok(()), Then::Panic) => {
                        testing::panic_deliberately("function bug after writing")
                    }
                }
            },
        )
        .await
}

/// The typed entry point's transactional variant (the inbox): 32 concurrent deliveries
/// of one message write its row once and every one settles with the same typed output;
/// an error or a panic after the write rolls it back and releases the key.
pub(crate) async fn check_inbox_writes_once_with_its_record<H: Harness, DB: Ledger>() {
    let setup = Arc::new(setup::<H, DB>().await);
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (setup, barrier) = (setup.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                inbox::<H, DB>(&setup, "msg-1", Then::Created).await
            })
        })
        .collect();
    let mut ran = 0;
    for task in tasks {
        match task.await.unwrap() {
            Outcome::Ran(output) => {
                ran += 1;
                assert_eq!(output, ("msg-1".to_owned(), 1));
            }
            Outcome::Replayed(output) => assert_eq!(output, ("msg-1".to_owned(), 1)),
            other => panic!("expected a run or a replay, got {other:?}"),
        }
    }
    assert_eq!(ran, 1);
    assert_eq!(setup.rows().await, 1, "one ledger row");
    assert_eq!(setup.runs.load(Ordering::SeqCst), 1);
    let mut rows = 1;
    for (key, then) in [("msg-err", Then::Err), ("msg-panic", Then::Panic)] {
        let failed = inbox::<H, DB>(&setup, key, then).await;
        match (&failed, then) {
            (Outcome::Failed(Failure::Error(_)), Then::Err)
            | (Outcome::Failed(Failure::Panicked), Then::Panic) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(setup.rows().await, rows, "{then:?}: the write rolled back");
        let retry = inbox::<H, DB>(&setup, key, Then::Created).await;
        assert!(matches!(retry, Outcome::Ran(_)), "{then:?}: {retry:?}");
        rows += 1;
        assert_eq!(setup.rows().await, rows, "{then:?}: written once");
    }
}

pub(crate) fn trials<H: Harness, DB: Ledger>() -> Vec<Trial> {
    let trial = |name: &str, check: fn() -> std::pin::Pin<Box<dyn Future<Output = ()>>>| {
        async_trial(format!("transaction::{name}"), check)
    };
    let trials = vec![
        trial("check_commit_together_and_replay", || {
            Box::pin(check_commit_together_and_replay::<H, DB>())
        }),
        trial("check_concurrent_duplicates_write_once", || {
            Box::pin(check_concurrent_duplicates_write_once::<H, DB>())
        }),
        trial("check_failures_roll_back_and_release", || {
            Box::pin(check_failures_roll_back_and_release::<H, DB>())
        }),
        trial("check_read_then_write_beside_other_commits", || {
            Box::pin(check_read_then_write_beside_other_commits::<H, DB>())
        }),
        trial("check_stale_owner_cannot_commit", || {
            Box::pin(check_stale_owner_cannot_commit::<H, DB>())
        }),
        trial("check_store_of_another_database_is_refused", || {
            Box::pin(check_store_of_another_database_is_refused::<H, DB>())
        }),
        trial("check_atomic_steps_resume_exactly_once", || {
            Box::pin(check_atomic_steps_resume_exactly_once::<H, DB>())
        }),
        trial("check_atomic_step_rolls_back_unless_recorded", || {
            Box::pin(check_atomic_step_rolls_back_unless_recorded::<H, DB>())
        }),
        trial("check_steps_refused_inside_a_transactional_handler", || {
            Box::pin(check_steps_refused_inside_a_transactional_handler::<H, DB>())
        }),
        trial("check_steps_refused_inside_an_atomic_step", || {
            Box::pin(check_steps_refused_inside_an_atomic_step::<H, DB>())
        }),
        trial("check_inbox_writes_once_with_its_record", || {
            Box::pin(check_inbox_writes_once_with_its_record::<H, DB>())
        }),
    ];
    ignored_if(H::unavailable(), trials)
}
