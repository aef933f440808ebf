//! A transactional handler whose transaction fails in the database is not a store outage:
//! a failed statement that leaves a Postgres transaction aborted, or a COMMIT the
//! database refuses (a deferred constraint), answers `500 transaction_aborted`, rolls
//! back and releases the key — and a handler that recovers with `Tx::savepoint` gets its
//! `Ok` answer recorded and replayed. On Postgres (each test in a schema of its own) and,
//! for the savepoint, on SQLite, which keeps a transaction usable after a failed
//! statement.
//!
//! Needs `IDEMPOTENT_TEST_POSTGRES_URL` for the Postgres tests; without it they are
//! reported as ignored.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http_body_util::BodyExt;
use idempotent_runtime::store::{PostgresStore, SqliteStore};
use idempotent_runtime::testing::{Trial, async_trial, ignored_if};
use idempotent_runtime::{Fingerprint, HandlerConfig, Idempotency, Postgres, Sqlite, Tx};

const URL_VAR: &str = "IDEMPOTENT_TEST_POSTGRES_URL";
const CONFIG: HandlerConfig = HandlerConfig::new();

fn unavailable() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => None,
        _ => Some(format!(
            "{URL_VAR} is not set (e.g. postgres://postgres@127.0.0.1:5432/test)"
        )),
    }
}

fn fingerprint(n: u8) -> Fingerprint {
    Fingerprint {
        version: 1,
        digest: [n; 32],
    }
}

async fn answer(response: Response) -> (StatusCode, bool, serde_json::Value) {
    let status = response.status();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, replayed, body)
}

/// A store in a fresh schema, with a `payers` table (unique ids) and a `notes` table
/// whose foreign key to `payers` is checked only at COMMIT; dropped afterwards.
struct Schema {
    pool: sqlx::PgPool,
    name: String,
    engine: Idempotency,
}

impl Schema {
    async fn new() -> Self {
        let url = std::env::var(URL_VAR).unwrap();
        let name = format!("idem_txfail_{:016x}", rand::random::<u64>());
        let store = PostgresStore::connect_in_schema(&url, &name)
            .await
            .expect("store");
        let pool = store.pool().clone();
        for ddl in [
            format!(r#"CREATE TABLE "{name}".payers (id TEXT PRIMARY KEY)"#),
            format!(
                r#"CREATE TABLE "{name}".notes (payer TEXT REFERENCES "{name}".payers (id)
                   DEFERRABLE INITIALLY DEFERRED, text TEXT)"#
            ),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(ddl))
                .execute(&pool)
                .await
                .unwrap();
        }
        Self {
            pool,
            name,
            engine: Idempotency::new(store),
        }
    }

    fn table(&self, table: &str) -> String {
        format!(r#""{}".{table}"#, self.name)
    }

    async fn count(&self, table: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM {}", self.table(table));
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    async fn drop(self) {
        let sql = format!(r#"DROP SCHEMA IF EXISTS "{}" CASCADE"#, self.name);
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&self.pool)
            .await
            .unwrap();
    }
}

/// Inserts payer `id` and (unless `recover`) a note; a duplicate payer is caught and the
/// handler answers `Ok` all the same — through a savepoint when `recover`.
async fn add_payer(
    tx: &mut Tx<Postgres>,
    payers: &str,
    id: &str,
    recover: bool,
) -> Result<Response, Response> {
    let insert = format!("INSERT INTO {payers} (id) VALUES ($1)");
    let inserted = if recover {
        let mut savepoint = tx
            .savepoint()
            .await
            .map_err(|e| e.to_string().into_response())?;
        let result = sqlx::query(sqlx::AssertSqlSafe(insert))
            .bind(id.to_owned())
            .execute(&mut *savepoint)
            .await;
        match result {
            Ok(_) => savepoint.commit().await.map(|_| true),
            Err(e) => savepoint.rollback().await.map(|_| {
                let _ = e;
                false
            }),
        }
    } else {
        sqlx::query(sqlx::AssertSqlSafe(insert))
            .bind(id.to_owned())
            .execute(tx.conn())
            .await
            .map(|_| true)
            .or(Ok(false))
    }
    .map_err(|e| e.to_string().into_response())?;
    let status = if inserted {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, format!(r#"{{"payer":"{id}","new":{inserted}}}"#)).into_response())
}

/// A handler that swallows a failed statement and returns `Ok` leaves the Postgres
/// transaction aborted: `500 transaction_aborted` (not `503`), nothing written, the key
/// released so that a retry runs again.
async fn a_failed_statement_that_is_not_recovered_is_transaction_aborted() {
    let schema = Schema::new().await;
    let payers = schema.table("payers");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {payers} (id) VALUES ('p1')"
    )))
    .execute(&schema.pool)
    .await
    .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let run = |recover: bool| {
        let (payers, runs) = (payers.clone(), runs.clone());
        schema.engine.run_in_transaction::<Postgres, _, _, _>(
            &CONFIG,
            "alice",
            "k",
            fingerprint(1),
            async move |_key, tx: &mut Tx<Postgres>| {
                runs.fetch_add(1, Ordering::SeqCst);
                add_payer(tx, &payers, "p1", recover).await
            },
        )
    };
    let (status, replayed, body) = answer(run(false).await).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!replayed);
    assert_eq!(body["code"], "transaction_aborted");
    // Released: the retry runs again, and this time recovers through a savepoint.
    let (status, replayed, body) = answer(run(true).await).await;
    assert_eq!((status, replayed), (StatusCode::OK, false));
    assert_eq!(body["new"], false);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    schema.drop().await;
}

/// With a savepoint the handler recovers from the failed statement, its other writes
/// commit, and its `Ok` answer is recorded and replayed.
async fn a_savepoint_recovers_and_the_answer_is_replayed() {
    let schema = Schema::new().await;
    let (payers, notes) = (schema.table("payers"), schema.table("notes"));
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {payers} (id) VALUES ('p1')"
    )))
    .execute(&schema.pool)
    .await
    .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let run = || {
        let (payers, notes, runs) = (payers.clone(), notes.clone(), runs.clone());
        schema.engine.run_in_transaction::<Postgres, _, _, _>(
            &CONFIG,
            "alice",
            "k",
            fingerprint(1),
            async move |_key, tx: &mut Tx<Postgres>| {
                runs.fetch_add(1, Ordering::SeqCst);
                let mut result = add_payer(tx, &payers, "p1", true).await;
                if result.is_ok() {
                    let note = format!("INSERT INTO {notes} (payer, text) VALUES ('p1', 'hi')");
                    if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(note))
                        .execute(tx.conn())
                        .await
                    {
                        result = Err(e.to_string().into_response());
                    }
                }
                result
            },
        )
    };
    let (status, replayed, first) = answer(run().await).await;
    assert_eq!((status, replayed), (StatusCode::OK, false));
    let (status, replayed, again) = answer(run().await).await;
    assert_eq!((status, replayed), (StatusCode::OK, true));
    assert_eq!(again, first);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(schema.count("notes").await, 1, "the other write committed");
    schema.drop().await;
}

/// A COMMIT the database refuses (a deferred foreign key) is `500 transaction_aborted`,
/// not a store outage: nothing written, the key released.
async fn a_refused_commit_is_transaction_aborted() {
    let schema = Schema::new().await;
    let notes = schema.table("notes");
    let runs = Arc::new(AtomicUsize::new(0));
    let run = || {
        let (notes, runs) = (notes.clone(), runs.clone());
        schema.engine.run_in_transaction::<Postgres, _, _, _>(
            &CONFIG,
            "alice",
            "k",
            fingerprint(1),
            async move |_key, tx: &mut Tx<Postgres>| {
                runs.fetch_add(1, Ordering::SeqCst);
                // No such payer: the deferred foreign key fails at COMMIT.
                let note = format!("INSERT INTO {notes} (payer, text) VALUES ('ghost', 'boo')");
                sqlx::query(sqlx::AssertSqlSafe(note))
                    .execute(tx.conn())
                    .await
                    .map(|_| StatusCode::CREATED)
                    .map_err(|e| e.to_string())
            },
        )
    };
    let (status, _, body) = answer(run().await).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body["code"], "transaction_aborted");
    assert_eq!(schema.count("notes").await, 0);
    let (status, _, body) = answer(run().await).await;
    assert_eq!(
        body["code"], "transaction_aborted",
        "released: it ran again"
    );
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    schema.drop().await;
}

/// SQLite, side by side: a failed statement does not abort the transaction there, so a
/// handler that catches it commits its other writes without a savepoint; the savepoint
/// works too.
async fn on_sqlite_a_failed_statement_leaves_the_transaction_usable() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::connect(dir.path().join("t.db").to_str().unwrap())
        .await
        .unwrap();
    let pool = store.pool().clone();
    sqlx::query("CREATE TABLE payers (id TEXT PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO payers (id) VALUES ('p1')")
        .execute(&pool)
        .await
        .unwrap();
    let engine = Idempotency::new(store);
    for (key, savepoint) in [("plain", false), ("savepoint", true)] {
        let response = engine
            .run_in_transaction::<Sqlite, _, _, _>(
                &CONFIG,
                "alice",
                key,
                fingerprint(1),
                async move |_key, tx: &mut Tx<Sqlite>| {
                    let duplicate = if savepoint {
                        let mut sp = tx.savepoint().await.unwrap();
                        let failed = sqlx::query("INSERT INTO payers (id) VALUES ('p1')")
                            .execute(&mut *sp)
                            .await
                            .is_err();
                        sp.rollback().await.unwrap();
                        failed
                    } else {
                        sqlx::query("INSERT INTO payers (id) VALUES ('p1')")
                            .execute(tx.conn())
                            .await
                            .is_err()
                    };
                    let other = format!("INSERT INTO payers (id) VALUES ('{key}')");
                    sqlx::query(sqlx::AssertSqlSafe(other))
                        .execute(tx.conn())
                        .await
                        .unwrap();
                    let result: Result<_, StatusCode> = Ok((StatusCode::OK, duplicate.to_string()));
                    result
                },
            )
            .await;
        assert_eq!(response.status(), StatusCode::OK, "{key}");
    }
    let payers: i64 = sqlx::query_scalar("SELECT count(*) FROM payers")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(payers, 3, "both handlers' other writes committed");
}

pub(crate) fn trials() -> Vec<Trial> {
    let mut trials = vec![async_trial(
        "on_sqlite_a_failed_statement_leaves_the_transaction_usable",
        on_sqlite_a_failed_statement_leaves_the_transaction_usable,
    )];
    let postgres: Vec<Trial> = vec![
        async_trial(
            "a_failed_statement_that_is_not_recovered_is_transaction_aborted",
            a_failed_statement_that_is_not_recovered_is_transaction_aborted,
        ),
        async_trial(
            "a_savepoint_recovers_and_the_answer_is_replayed",
            a_savepoint_recovers_and_the_answer_is_replayed,
        ),
        async_trial(
            "a_refused_commit_is_transaction_aborted",
            a_refused_commit_is_transaction_aborted,
        ),
    ];
    trials.extend(ignored_if(unavailable(), postgres));
    trials
}
