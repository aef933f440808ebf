//! Recovery points on Postgres, beyond the conformance suite: the in-place upgrade of a
//! version-3 database, the notification a release that keeps a record sends its waiters,
//! and a step recorded in a transaction.

use std::borrow::Cow;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use idempotent_runtime::Store;
use idempotent_runtime::store::{ClaimOutcome, FencingToken};
use idempotent_runtime::store::{PostgresStore, RecordedStep, encode_headers};
use idempotent_runtime::testing::{Trial, async_trial};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgListener, PgPool};
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row, SqlSafeStr};

use super::{TestSchema, database_url};
use crate::fixtures::{FINGERPRINT, claim_request, must_resume, stored};

pub(crate) fn trials() -> Vec<Trial> {
    vec![
        async_trial(
            "steps::upgrades_a_version_3_database_in_place",
            upgrades_a_version_3_database_in_place,
        ),
        async_trial(
            "steps::a_release_that_keeps_steps_notifies_waiters",
            a_release_that_keeps_steps_notifies_waiters,
        ),
        async_trial(
            "steps::record_step_in_commits_and_rolls_back_with_the_transaction",
            record_step_in_commits_and_rolls_back_with_the_transaction,
        ),
    ]
}

/// The channel the claim-ended triggers notify (`notify.rs`).
const CHANNEL: &str = "idempotent_claim_ended";

fn step(name: &str, output: &str) -> RecordedStep {
    RecordedStep {
        name: name.to_owned(),
        output: Bytes::from(output.to_owned()),
        recorded_at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_000),
    }
}

/// Ends the lease of every record of `table` (the database clock moving past it).
async fn end_leases(pool: &PgPool, table: &str) {
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {table} SET lease_expires_at = now() - interval '1 second'"
    )))
    .execute(pool)
    .await
    .expect("end leases");
}

/// The payload the triggers send for (scope, key), computed as migration 2 does.
async fn claim_id(pool: &PgPool, scope: &str, key: &str) -> String {
    sqlx::query_scalar(
        "SELECT left(encode(sha256(convert_to($1, 'UTF8') || '\\x00'::bytea \
         || convert_to($2, 'UTF8')), 'hex'), 32)",
    )
    .bind(scope)
    .bind(key)
    .fetch_one(pool)
    .await
    .expect("claim id")
}

/// The migration statements of versions 1 to `up_to`, as a database created by an
/// earlier release applied them.
pub(super) fn migrator_up_to(up_to: i64, table: String) -> Migrator {
    let files = [
        (
            1,
            "idempotency records",
            include_str!("../../../migrations/postgres/0001_idempotency_records.sql"),
        ),
        (
            2,
            "claim ended notify",
            include_str!("../../../migrations/postgres/0002_claim_ended_notify.sql"),
        ),
        (
            3,
            "notify only waited claims",
            include_str!("../../../migrations/postgres/0003_notify_only_waited_claims.sql"),
        ),
        (
            4,
            "recorded steps",
            include_str!("../../../migrations/postgres/0004_recorded_steps.sql"),
        ),
    ];
    let migrations = files
        .into_iter()
        .filter(|(version, ..)| *version <= up_to)
        .map(|(version, description, sql)| {
            Migration::new(
                version,
                Cow::Borrowed(description),
                MigrationType::Simple,
                sql.into_sql_str(),
                false,
            )
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(table);
    migrator
}

/// A database at schema version 3 with a completed and an in-progress record: opening
/// the store adds the steps column in place, the completed record still replays, the
/// in-progress one records steps and is taken over with them once its lease ran out.
async fn upgrades_a_version_3_database_in_place() {
    let url = database_url();
    let schema = TestSchema::new(&url).await;
    let table = schema.table();
    let mut conn = PgConnection::connect(&url).await.unwrap();
    for statement in [
        format!("CREATE SCHEMA \"{}\"", schema.name),
        format!("SET search_path TO \"{}\"", schema.name),
    ] {
        sqlx::query(AssertSqlSafe(statement))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    migrator_up_to(3, format!("\"{}\"._idempotent_migrations", schema.name))
        .run_direct(None, &mut conn, false)
        .await
        .expect("schema v3");
    let response = stored(br#"{"id":"pay_1"}"#);
    let held_by = FencingToken::random();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (scope, key, fingerprint, fingerprint_version, state, token,
                              lease_expires_at, status, headers, body, created_at, expires_at)
         VALUES ('acct_alice', 'done', $1, $2, 'completed', 1, now(), 201, $3, $4, now(),
                 now() + interval '1 hour'),
                ('acct_alice', 'running', $1, $2, 'in_progress', $5,
                 now() + interval '30 seconds', NULL, NULL, NULL, now(),
                 now() + interval '1 hour')"
    )))
    .bind(&FINGERPRINT.digest[..])
    .bind(FINGERPRINT.version)
    .bind(encode_headers(&response.headers))
    .bind(response.body.as_deref())
    .bind(held_by.0)
    .execute(&mut conn)
    .await
    .unwrap();

    let store = PostgresStore::connect_in_schema(&url, &schema.name)
        .await
        .expect("the store opens and migrates the v3 schema");
    let applied: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT version FROM \"{}\"._idempotent_migrations ORDER BY version",
        schema.name
    )))
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(applied, vec![1, 2, 3, 4, 5]);
    let (rows, without_steps): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT count(*), count(*) FILTER (WHERE steps IS NULL) FROM {table}"
    )))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        (rows, without_steps),
        (2, 2),
        "both records kept, with no steps"
    );

    // The completed record replays as before.
    let replay = store
        .claim(&claim_request("done", FencingToken::random()))
        .await
        .unwrap();
    assert_eq!(replay.outcome, ClaimOutcome::Replay(response));
    // The in-progress one is still held, and its holder can record steps now.
    let duplicate = store
        .claim(&claim_request("running", FencingToken::random()))
        .await
        .unwrap();
    assert!(
        matches!(duplicate.outcome, ClaimOutcome::InProgress { .. }),
        "{duplicate:?}"
    );
    let recorded = step("charge", r#"{"charge":"ch_1"}"#);
    assert!(
        store
            .record_step("acct_alice", "running", held_by, &recorded)
            .await
            .unwrap()
    );
    end_leases(store.pool(), &table).await;
    must_resume(&store, "running", vec![recorded]).await;
    let _ = conn.close().await;
}

/// A duplicate waiting for a claim marks its record (`waited`); a release that keeps the
/// record for its steps then notifies it exactly like a release that deletes, while the
/// owner's recorded steps and renewals notify nothing. A completion of another waited
/// record, between them, shows the order: its notification must come first.
async fn a_release_that_keeps_steps_notifies_waiters() {
    let url = database_url();
    let schema = TestSchema::new(&url).await;
    let table = schema.table();
    let store = PostgresStore::connect_in_schema(&url, &schema.name)
        .await
        .unwrap();
    let (owner, marker) = (FencingToken::random(), FencingToken::random());
    store.claim(&claim_request("kept", owner)).await.unwrap();
    store.claim(&claim_request("marker", marker)).await.unwrap();
    // What a waiting duplicate's `mark_waited.sql` does, for both records.
    sqlx::query(AssertSqlSafe(format!("UPDATE {table} SET waited = true")))
        .execute(store.pool())
        .await
        .unwrap();
    let mut listener = PgListener::connect(&url).await.unwrap();
    listener.listen(CHANNEL).await.unwrap();

    let recorded = step("reserve", "ok");
    assert!(
        store
            .record_step("acct_alice", "kept", owner, &recorded)
            .await
            .unwrap()
    );
    assert!(
        store
            .renew(
                "acct_alice",
                "kept",
                owner,
                Duration::from_secs(30),
                Duration::from_secs(3600)
            )
            .await
            .unwrap()
    );
    assert!(
        store
            .complete("acct_alice", "marker", marker, &stored(b"{}"))
            .await
            .unwrap()
    );
    assert!(store.release("acct_alice", "kept", owner).await.unwrap());

    let pool = store.pool();
    for expected in ["marker", "kept"] {
        let notification = tokio::time::timeout(Duration::from_secs(10), listener.recv())
            .await
            .unwrap_or_else(|_| panic!("no notification for {expected}"))
            .unwrap();
        assert_eq!(
            notification.payload(),
            claim_id(pool, "acct_alice", expected).await,
            "expected {expected}'s notification next"
        );
    }

    // Kept, in progress, its lease over, no longer marked (the next waiter marks anew),
    // and the released owner fenced off.
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT state, waited, token, lease_expires_at <= now() AS lease_over, \
         steps IS NOT NULL AS has_steps FROM {table} WHERE key = 'kept'"
    )))
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(row.get::<String, _>("state"), "in_progress");
    assert!(!row.get::<bool, _>("waited"));
    assert_eq!(row.get::<i64, _>("token"), FencingToken::RELEASED.0);
    assert!(row.get::<bool, _>("lease_over"));
    assert!(row.get::<bool, _>("has_steps"));
    assert!(
        !store
            .record_step("acct_alice", "kept", owner, &recorded)
            .await
            .unwrap()
    );
    must_resume(&store, "kept", vec![recorded]).await;
}

/// `record_step_in` appends on the handler's transaction: a rolled-back step is gone, a
/// committed one comes back to the takeover, and a token that does not own the claim
/// records nothing there either.
async fn record_step_in_commits_and_rolls_back_with_the_transaction() {
    let url = database_url();
    let schema = TestSchema::new(&url).await;
    let store = PostgresStore::connect_in_schema(&url, &schema.name)
        .await
        .unwrap();
    let tx_store = store
        .capabilities()
        .transactions
        .and_then(|support| support.for_database::<sqlx::Postgres>())
        .expect("a Postgres store offers transactions");
    let owner = FencingToken::random();
    store.claim(&claim_request("tx", owner)).await.unwrap();
    let (rolled_back, committed) = (step("draft", "x"), step("ledger", "entry_1"));

    let mut tx = tx_store.begin().await.unwrap();
    assert!(
        tx_store
            .record_step_in(&mut tx, "acct_alice", "tx", owner, &rolled_back)
            .await
            .unwrap()
    );
    tx.rollback().await.unwrap();

    let mut tx = tx_store.begin().await.unwrap();
    assert!(
        !tx_store
            .record_step_in(
                &mut tx,
                "acct_alice",
                "tx",
                FencingToken::random(),
                &committed
            )
            .await
            .unwrap(),
        "another token does not own the claim"
    );
    assert!(
        tx_store
            .record_step_in(&mut tx, "acct_alice", "tx", owner, &committed)
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();

    end_leases(store.pool(), &schema.table()).await;
    must_resume(&store, "tx", vec![committed]).await;
}
