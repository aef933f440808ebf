//! The fenced record register on Postgres, beyond the conformance suite: the in-place
//! upgrade of a version-4 database holding live records to record versions, and claims
//! of one key racing on many connections, where a record committed after an insert's
//! snapshot must still be answered.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use idempotent_runtime::Store;
use idempotent_runtime::store::{ClaimOutcome, FencingToken, Takeover};
use idempotent_runtime::store::{PostgresStore, RecordedStep, encode_headers, encode_step};
use idempotent_runtime::testing::{Trial, async_trial};
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use tokio::sync::Barrier;
use tracing::instrument::WithSubscriber;
use tracing_subscriber::layer::SubscriberExt;

use super::steps::migrator_up_to;
use super::{TestSchema, database_url};
use crate::fixtures::{FINGERPRINT, LEASE, TTL, claim_request, must_resume, stored};

pub(crate) fn trials() -> Vec<Trial> {
    vec![
        async_trial(
            "versions::upgrades_a_version_4_database_with_live_records_in_place",
            upgrades_a_version_4_database_with_live_records_in_place,
        ),
        async_trial(
            "versions::claims_of_one_key_racing_on_many_connections_have_one_winner",
            claims_of_one_key_racing_on_many_connections_have_one_winner,
        ),
    ]
}

fn step(name: &str, output: &str) -> RecordedStep {
    RecordedStep {
        name: name.to_owned(),
        output: Bytes::from(output.to_owned()),
        recorded_at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_000),
    }
}

/// The `version` of the record of `key`.
async fn version_of(conn: &mut PgConnection, table: &str, key: &str) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT version FROM {table} WHERE key = $1"
    )))
    .bind(key)
    .fetch_one(conn)
    .await
    .unwrap()
}

/// A database at schema version 4 (the release before record versions) holding a
/// completed record, one in progress, one in progress with a step and one a release kept
/// for its step: the store adds the version column in place, and every record goes on
/// through the new store. The holders the earlier release's process left (their tokens
/// unknown to the new store) still renew, record steps and complete; a takeover resumes
/// the steps recorded before and after the upgrade; and a write in the earlier release's
/// style (fenced by token only, as an instance not yet upgraded writes) still moves the
/// version, so an upgraded owner's compare-and-set cannot overwrite it.
async fn upgrades_a_version_4_database_with_live_records_in_place() {
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
    migrator_up_to(4, format!("\"{}\"._idempotent_migrations", schema.name))
        .run_direct(None, &mut conn, false)
        .await
        .expect("schema v4");
    let response = stored(br#"{"id":"pay_1"}"#);
    let (running, stepping) = (FencingToken::random(), FencingToken::random());
    let (reserve, charge) = (step("reserve", "r_1"), step("charge", "ch_1"));
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (scope, key, fingerprint, fingerprint_version, state, token,
                              lease_expires_at, status, headers, body, created_at,
                              expires_at, steps)
         VALUES ('acct_alice', 'done', $1, $2, 'completed', 1, now(), 201, $3, $4, now(),
                 now() + interval '1 hour', NULL),
                ('acct_alice', 'running', $1, $2, 'in_progress', $5,
                 now() + interval '30 seconds', NULL, NULL, NULL, now(),
                 now() + interval '1 hour', NULL),
                ('acct_alice', 'stepping', $1, $2, 'in_progress', $6,
                 now() + interval '30 seconds', NULL, NULL, NULL, now(),
                 now() + interval '1 hour', $7),
                ('acct_alice', 'released', $1, $2, 'in_progress', $8,
                 now(), NULL, NULL, NULL, now(), now() + interval '1 hour', $7)"
    )))
    .bind(&FINGERPRINT.digest[..])
    .bind(FINGERPRINT.version)
    .bind(encode_headers(&response.headers))
    .bind(response.body.as_deref())
    .bind(running.0)
    .bind(stepping.0)
    .bind(encode_step(&reserve))
    .bind(FencingToken::RELEASED.0)
    .execute(&mut conn)
    .await
    .unwrap();

    let store = PostgresStore::connect_in_schema(&url, &schema.name)
        .await
        .expect("the store opens and migrates the v4 schema");
    let applied: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT version FROM \"{}\"._idempotent_migrations ORDER BY version",
        schema.name
    )))
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(applied, vec![1, 2, 3, 4, 5]);
    let versions: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT version FROM {table} ORDER BY key"
    )))
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(versions, vec![0; 4], "every record kept, at version 0");
    // A record an instance of the earlier release inserts from now on (naming no
    // version) gets a random one, never a version an earlier record of its key had.
    for key in ["old-insert-1", "old-insert-2"] {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (scope, key, fingerprint, fingerprint_version, state, token,
                                  lease_expires_at, created_at, expires_at)
             VALUES ('acct_alice', $1, $2, $3, 'in_progress', 7, now(), now(), now())"
        )))
        .bind(key)
        .bind(&FINGERPRINT.digest[..])
        .bind(FINGERPRINT.version)
        .execute(&mut conn)
        .await
        .unwrap();
    }
    let (first, second) = (
        version_of(&mut conn, &table, "old-insert-1").await,
        version_of(&mut conn, &table, "old-insert-2").await,
    );
    assert!(
        first != 0 && second != 0 && first != second,
        "{first}, {second}"
    );

    // The completed record replays.
    let replay = store
        .claim(&claim_request("done", FencingToken::random()))
        .await
        .unwrap();
    assert_eq!(replay.outcome, ClaimOutcome::Replay(response.clone()));

    // The running one is held; its holder renews and completes it.
    let duplicate = store
        .claim(&claim_request("running", FencingToken::random()))
        .await
        .unwrap();
    assert!(
        matches!(duplicate.outcome, ClaimOutcome::InProgress { .. }),
        "{duplicate:?}"
    );
    assert!(
        store
            .renew("acct_alice", "running", running, LEASE, TTL)
            .await
            .unwrap()
    );
    assert!(
        store
            .complete("acct_alice", "running", running, &response)
            .await
            .unwrap()
    );
    let replay = store
        .claim(&claim_request("running", FencingToken::random()))
        .await
        .unwrap();
    assert_eq!(replay.outcome, ClaimOutcome::Replay(response.clone()));

    // The one with a step: its holder records another, then stops; a takeover resumes
    // both and completes.
    assert!(
        store
            .record_step("acct_alice", "stepping", stepping, &charge)
            .await
            .unwrap()
    );
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {table} SET lease_expires_at = now() - interval '1 second' \
         WHERE key = 'stepping'"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    let taker = must_resume(&store, "stepping", vec![reserve.clone(), charge.clone()]).await;
    assert!(
        !store
            .record_step("acct_alice", "stepping", stepping, &charge)
            .await
            .unwrap(),
        "the old holder is fenced off"
    );
    assert!(
        store
            .complete("acct_alice", "stepping", taker, &response)
            .await
            .unwrap()
    );

    // The released one resumes its step for the same request, and completes.
    let taker = must_resume(&store, "released", vec![reserve.clone()]).await;

    // An instance of the earlier release renews the new owner's claim its own way (by
    // token): the version moves, so the owner's next compare-and-set finds it stale,
    // reads the record and writes on the version it finds, and its cached version of
    // before is never taken for current.
    let before = version_of(&mut conn, &table, "released").await;
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {table} SET lease_expires_at = now() + interval '30 seconds' \
         WHERE scope = 'acct_alice' AND key = 'released' AND token = $1 \
         AND state = 'in_progress'"
    )))
    .bind(taker.0)
    .execute(&mut conn)
    .await
    .unwrap();
    let after = version_of(&mut conn, &table, "released").await;
    assert_ne!(before, after, "a token-fenced write moves the version");
    assert!(
        store
            .complete("acct_alice", "released", taker, &response)
            .await
            .unwrap()
    );
    assert_ne!(version_of(&mut conn, &table, "released").await, after);
    let replay = store
        .claim(&claim_request("released", FencingToken::random()))
        .await
        .unwrap();
    assert_eq!(replay.outcome, ClaimOutcome::Replay(response));
    let _ = conn.close().await;
}

/// Counts the store's re-reads: its `store_reread` debug events.
#[derive(Clone, Default)]
struct Rereads(Arc<AtomicU64>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Rereads {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct IsReread(bool);
        impl tracing::field::Visit for IsReread {
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                self.0 |= field.name() == "event" && value == "store_reread";
            }
            fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
        }
        let mut reread = IsReread(false);
        event.record(&mut reread);
        if reread.0 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Many claims of one key at once, from four stores (four pools, up to forty
/// connections): exactly one is claimed and every other one answered in progress. Most
/// losers' inserts are stopped by the winner's row, committed after their statement's
/// snapshot was taken, so the snapshot shows them nothing: the store must read the
/// record again rather than take the silence for a fresh key or an error. The re-reads
/// are counted to show the race was run.
async fn claims_of_one_key_racing_on_many_connections_have_one_winner() {
    let url = database_url();
    let schema = TestSchema::new(&url).await;
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(Arc::new(
            PostgresStore::connect_in_schema(&url, &schema.name)
                .await
                .unwrap(),
        ));
    }
    let rereads = Rereads::default();
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(rereads.clone()));
    const CLAIMS: usize = 64;
    for round in 0..8 {
        let key = format!("race-{round}");
        let barrier = Arc::new(Barrier::new(CLAIMS));
        let tasks: Vec<_> = (0..CLAIMS)
            .map(|i| {
                let (store, barrier, key) = (
                    stores[i % stores.len()].clone(),
                    barrier.clone(),
                    key.clone(),
                );
                tokio::spawn(
                    async move {
                        let token = FencingToken::random();
                        barrier.wait().await;
                        let outcome = store.claim(&claim_request(&key, token)).await;
                        (outcome.expect("claim").outcome, token)
                    }
                    .with_subscriber(dispatch.clone()),
                )
            })
            .collect();
        let mut winners = 0;
        for task in tasks {
            match task.await.expect("task") {
                (
                    ClaimOutcome::Claimed {
                        token: won,
                        takeover,
                        steps,
                    },
                    token,
                ) => {
                    assert_eq!(
                        (won, takeover, steps),
                        (token, None::<Takeover>, Vec::new())
                    );
                    winners += 1;
                }
                (ClaimOutcome::InProgress { retry_after }, _) => {
                    assert!(
                        retry_after > Duration::ZERO && retry_after <= LEASE,
                        "{retry_after:?}"
                    );
                }
                (other, _) => panic!("round {round}: {other:?}"),
            }
        }
        assert_eq!(winners, 1, "round {round}: exactly one claim wins");
    }
    let rereads = rereads.0.load(Ordering::SeqCst);
    eprintln!("re-reads after a record committed past the snapshot: {rereads}");
    assert!(rereads > 0, "the race never made an insert read again");
}
