//! The conformance suite on [`SqliteStore`] (a real file in a temporary directory, a
//! multi-connection pool, a manual clock), plus what only SQLite has: opening files,
//! migrations, journal mode.
pub(crate) mod group_commit;
pub(crate) mod leases;
pub(crate) mod steps;

use std::sync::Arc;
use std::time::Duration;

use idempotent_runtime::clock::ManualClock;
use idempotent_runtime::store::SqliteStore;
use idempotent_runtime::store::{
    ClaimOutcome, ClaimRequest, FencingToken, RecordStore, StoredResponse,
};
use idempotent_runtime::testing::conformance::{self, Harness, RecordsHarness};
use idempotent_runtime::testing::{Trial, async_trial};
use idempotent_runtime::{Fingerprint, Store, StoreError};
use sqlx::Row;
use tempfile::TempDir;

use crate::transaction;

const START: i64 = 1_700_000_000_000;

/// A fresh [`SqliteStore`] in its own temporary directory, on a [`ManualClock`]; another
/// store is another `SqliteStore` on the same file and clock (its own pool and writer).
struct SqliteHarness {
    store: Arc<SqliteStore>,
    clock: ManualClock,
    path: String,
    _dir: TempDir,
}

#[async_trait::async_trait]
impl Harness for SqliteHarness {
    async fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = ManualClock::at_millis(START);
        let path = path_in(&dir, "idempotency.db");
        let store = SqliteStore::connect_with_clock(&path, Arc::new(clock.clone()))
            .await
            .expect("open sqlite store");
        Self {
            store: Arc::new(store),
            clock,
            path,
            _dir: dir,
        }
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn advance(&self, d: Duration) {
        self.clock.advance(d);
    }

    async fn step_wall(&self, by_millis: i64) -> bool {
        self.clock.step_wall(by_millis);
        true
    }

    async fn another_store(&self) -> Option<Arc<dyn Store>> {
        let store = SqliteStore::connect_with_clock(&self.path, Arc::new(self.clock.clone()))
            .await
            .expect("open another store on the file");
        Some(Arc::new(store))
    }
}

impl RecordsHarness for SqliteHarness {
    fn records(&self) -> &dyn RecordStore {
        self.store.records()
    }
}

pub(crate) fn trials() -> Vec<Trial> {
    let own: Vec<Trial> = vec![
        async_trial(
            "open_in_a_missing_directory_is_an_open_error_naming_the_path",
            open_in_a_missing_directory_is_an_open_error_naming_the_path,
        ),
        async_trial(
            "open_of_a_directory_or_a_non_database_is_an_open_error",
            open_of_a_directory_or_a_non_database_is_an_open_error,
        ),
        async_trial(
            "open_accepts_a_sqlite_url_and_creates_the_file",
            open_accepts_a_sqlite_url_and_creates_the_file,
        ),
        async_trial(
            "records_survive_closing_and_reopening_the_file",
            records_survive_closing_and_reopening_the_file,
        ),
        async_trial(
            "migrations_are_idempotent_on_reopen",
            migrations_are_idempotent_on_reopen,
        ),
        async_trial(
            "a_database_of_the_schema_before_steps_upgrades_in_place",
            a_database_of_the_schema_before_steps_upgrades_in_place,
        ),
        async_trial(
            "a_database_of_the_schema_before_versions_upgrades_in_place",
            a_database_of_the_schema_before_versions_upgrades_in_place,
        ),
        async_trial(
            "concurrent_first_opens_of_one_file_all_succeed",
            concurrent_first_opens_of_one_file_all_succeed,
        ),
        async_trial(
            "the_store_uses_wal_a_busy_timeout_and_full_sync",
            the_store_uses_wal_a_busy_timeout_and_full_sync,
        ),
        async_trial(
            "times_are_milliseconds_from_the_injected_clock",
            times_are_milliseconds_from_the_injected_clock,
        ),
        async_trial(
            "an_app_can_share_its_pool_with_the_store",
            an_app_can_share_its_pool_with_the_store,
        ),
        async_trial(
            "a_corrupt_record_is_an_error_not_a_panic",
            a_corrupt_record_is_an_error_not_a_panic,
        ),
    ];
    let mut trials = conformance::trials::<SqliteHarness>();
    trials.extend(conformance::record_trials::<SqliteHarness>());
    trials.extend(transaction::trials::<SqliteHarness, sqlx::Sqlite>());
    trials.extend(own);
    trials.extend(group_commit::trials());
    trials.extend(leases::trials());
    trials.extend(steps::trials());
    trials
}

fn fingerprint() -> Fingerprint {
    Fingerprint {
        version: 1,
        digest: [42; 32],
    }
}

fn claim_request(token: FencingToken) -> ClaimRequest<'static> {
    static FINGERPRINT: Fingerprint = Fingerprint {
        version: 1,
        digest: [42; 32],
    };
    ClaimRequest {
        scope: "acct_alice",
        key: "key-1",
        fingerprint: &FINGERPRINT,
        ttl: Duration::from_secs(3600),
        lease: Duration::from_secs(30),
        token,
    }
}

fn path_in(dir: &TempDir, name: &str) -> String {
    dir.path()
        .join(name)
        .to_str()
        .expect("utf-8 path")
        .to_owned()
}

async fn open_in_a_missing_directory_is_an_open_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = path_in(&dir, "no-such-dir/idempotency.db");
    match SqliteStore::connect(&path).await {
        Err(StoreError::Open { location, reason }) => {
            assert_eq!(location, path);
            assert!(!reason.is_empty());
            let message = StoreError::Open { location, reason }.to_string();
            assert!(message.contains(&path), "{message}");
        }
        other => panic!("expected StoreError::Open, got {other:?}"),
    }
}

async fn open_of_a_directory_or_a_non_database_is_an_open_error() {
    let dir = tempfile::tempdir().unwrap();
    let as_dir = dir.path().to_str().unwrap().to_owned();
    assert!(
        matches!(SqliteStore::connect(&as_dir).await, Err(StoreError::Open { ref location, .. }) if *location == as_dir)
    );
    let junk = path_in(&dir, "junk.db");
    std::fs::write(&junk, vec![b'x'; 8192]).unwrap();
    assert!(
        matches!(SqliteStore::connect(&junk).await, Err(StoreError::Open { ref location, .. }) if *location == junk)
    );
}

async fn open_accepts_a_sqlite_url_and_creates_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = path_in(&dir, "from-url.db");
    let store = SqliteStore::connect(&format!("sqlite://{path}"))
        .await
        .expect("open url");
    assert!(std::path::Path::new(&path).exists());
    let token = FencingToken::random();
    assert_eq!(
        store.claim(&claim_request(token)).await.unwrap().outcome,
        ClaimOutcome::Claimed {
            token,
            takeover: None,
            steps: Vec::new(),
        }
    );
}

async fn records_survive_closing_and_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = path_in(&dir, "durable.db");
    let stored = StoredResponse {
        status: 201,
        headers: vec![("location".to_owned(), b"/payments/1".to_vec())],
        body: Some(bytes::Bytes::from_static(b"{\"id\":1}")),
    };
    let running = FencingToken::random();
    {
        let store = SqliteStore::connect(&path).await.unwrap();
        let token = FencingToken::random();
        assert_eq!(
            store.claim(&claim_request(token)).await.unwrap().outcome,
            ClaimOutcome::Claimed {
                token,
                takeover: None,
                steps: Vec::new(),
            }
        );
        assert!(
            store
                .complete("acct_alice", "key-1", token, &stored)
                .await
                .unwrap()
        );
        let running_claim = ClaimRequest {
            key: "key-2",
            ..claim_request(running)
        };
        assert!(matches!(
            store.claim(&running_claim).await.unwrap().outcome,
            ClaimOutcome::Claimed { .. }
        ));
        store.pool().close().await;
    }
    let store = SqliteStore::connect(&path).await.unwrap();
    assert_eq!(
        store
            .claim(&claim_request(FencingToken::random()))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::Replay(stored)
    );
    // The in-progress claim and its token survived too.
    assert!(
        store
            .renew(
                "acct_alice",
                "key-2",
                running,
                Duration::from_secs(30),
                Duration::from_secs(3600)
            )
            .await
            .unwrap()
    );
}

async fn migrations_are_idempotent_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = path_in(&dir, "migrate.db");
    for _ in 0..3 {
        let store = SqliteStore::connect(&path).await.expect("reopen");
        let applied: i64 =
            sqlx::query("SELECT COUNT(*) FROM _idempotent_sqlite_migrations WHERE success")
                .fetch_one(store.pool())
                .await
                .unwrap()
                .get(0);
        assert_eq!(applied, SqliteStore::migrator().iter().count() as i64);
        store.pool().close().await;
    }
}

/// A file at schema version 2 (before recorded steps), holding a completed record and an
/// in-progress one as the store of that version wrote them: opening it applies migration
/// 3 in place, the completed record replays, the running claim's token still owns its
/// record and records steps on it, and a retry after its lease takes it over with them.
async fn a_database_of_the_schema_before_steps_upgrades_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = path_in(&dir, "v2.db");
    let clock = ManualClock::at_millis(START);
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(SqliteStore::connect_options(&path).unwrap())
        .await
        .unwrap();
    SqliteStore::migrator().run_to(2, &pool).await.unwrap();
    let columns = |pool| async move {
        sqlx::query_scalar::<_, String>("SELECT name FROM pragma_table_info('idempotency_records')")
            .fetch_all(pool)
            .await
            .unwrap()
    };
    assert!(!columns(&pool).await.contains(&"steps".to_owned()));
    let stored = StoredResponse {
        status: 201,
        headers: vec![("location".to_owned(), b"/payments/1".to_vec())],
        body: Some(bytes::Bytes::from_static(b"{\"id\":1}")),
    };
    let done = FencingToken::random();
    sqlx::query(
        "INSERT INTO idempotency_records (scope, key, fingerprint, fingerprint_version, \
         state, token, lease_expires_at, status, headers, body, created_at, expires_at) \
         VALUES ('acct_alice', 'key-1', ?1, 1, 'completed', ?2, NULL, 201, ?3, ?4, ?5, ?6)",
    )
    .bind(fingerprint().digest.to_vec())
    .bind(done.0)
    .bind(idempotent_runtime::store::encode_headers(&stored.headers))
    .bind(stored.body.as_deref().map(<[u8]>::to_vec))
    .bind(START)
    .bind(START + 3_600_000)
    .execute(&pool)
    .await
    .unwrap();
    // Running, its lease on the manual clock's boot (id 1) until 30 s from now.
    let running = FencingToken::random();
    sqlx::query(
        "INSERT INTO idempotency_records (scope, key, fingerprint, fingerprint_version, \
         state, token, lease_expires_at, created_at, expires_at, lease_boot_id, \
         lease_ends_boot_ms) \
         VALUES ('acct_alice', 'key-2', ?1, 1, 'in_progress', ?2, ?3, ?4, ?5, ?6, ?3)",
    )
    .bind(fingerprint().digest.to_vec())
    .bind(running.0)
    .bind(START + 30_000)
    .bind(START)
    .bind(START + 3_600_000)
    .bind(1u128.to_be_bytes().to_vec())
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;

    let store = SqliteStore::connect_with_clock(&path, Arc::new(clock.clone()))
        .await
        .expect("open upgrades the file");
    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _idempotent_sqlite_migrations ORDER BY version")
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert_eq!(applied, [1, 2, 3, 4]);
    assert!(columns(store.pool()).await.contains(&"steps".to_owned()));
    assert_eq!(
        store
            .claim(&claim_request(FencingToken::random()))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::Replay(stored)
    );
    let running_claim = |token| ClaimRequest {
        key: "key-2",
        ..claim_request(token)
    };
    assert!(matches!(
        store
            .claim(&running_claim(FencingToken::random()))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::InProgress { .. }
    ));
    let step = idempotent_runtime::store::RecordedStep {
        name: "charge".to_owned(),
        output: bytes::Bytes::from_static(&[0, 0xFF, 0]),
        recorded_at: std::time::UNIX_EPOCH + Duration::from_millis(START as u64),
    };
    assert!(
        store
            .record_step("acct_alice", "key-2", running, &step)
            .await
            .unwrap()
    );
    clock.advance(Duration::from_secs(31));
    let retry = FencingToken::random();
    assert_eq!(
        store.claim(&running_claim(retry)).await.unwrap().outcome,
        ClaimOutcome::Claimed {
            token: retry,
            takeover: Some(idempotent_runtime::store::Takeover::LeaseLost),
            steps: vec![step],
        }
    );
}

/// A file at schema version 3 (before record versions), holding a completed record, a
/// running claim and a claim with a recorded step whose lease ran out, as the store of
/// that version wrote them: opening it applies migration 4 in place; the completed record
/// replays, the running owner records a step and completes, the stepped record is taken
/// over with its step; and a write or insert of an earlier release (which knows no
/// version) still moves the version, so an upgraded owner's compare-and-set cannot
/// overwrite it.
async fn a_database_of_the_schema_before_versions_upgrades_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = path_in(&dir, "v3.db");
    let clock = ManualClock::at_millis(START);
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(SqliteStore::connect_options(&path).unwrap())
        .await
        .unwrap();
    SqliteStore::migrator().run_to(3, &pool).await.unwrap();
    let stored = StoredResponse {
        status: 200,
        headers: vec![("content-type".to_owned(), b"text/plain".to_vec())],
        body: Some(bytes::Bytes::from_static(b"done")),
    };
    sqlx::query(
        "INSERT INTO idempotency_records (scope, key, fingerprint, fingerprint_version, \
         state, token, status, headers, body, created_at, expires_at) \
         VALUES ('acct_alice', 'key-1', ?1, 1, 'completed', 7, 200, ?2, ?3, ?4, ?5)",
    )
    .bind(fingerprint().digest.to_vec())
    .bind(idempotent_runtime::store::encode_headers(&stored.headers))
    .bind(stored.body.as_deref().map(<[u8]>::to_vec))
    .bind(START)
    .bind(START + 3_600_000)
    .execute(&pool)
    .await
    .unwrap();
    let step = idempotent_runtime::store::RecordedStep {
        name: "charge".to_owned(),
        output: bytes::Bytes::from_static(&[0, 0xFF, 0]),
        recorded_at: std::time::UNIX_EPOCH + Duration::from_millis(START as u64),
    };
    let (running, stepped) = (FencingToken::random(), FencingToken::random());
    // key-2 runs until 30 s from now; key-3's lease ran out a second ago, with a step.
    for (key, token, lease_end, steps) in [
        ("key-2", running, START + 30_000, None),
        (
            "key-3",
            stepped,
            START - 1_000,
            Some(idempotent_runtime::store::encode_step(&step)),
        ),
    ] {
        sqlx::query(
            "INSERT INTO idempotency_records (scope, key, fingerprint, fingerprint_version, \
             state, token, lease_expires_at, created_at, expires_at, lease_boot_id, \
             lease_ends_boot_ms, steps) \
             VALUES ('acct_alice', ?1, ?2, 1, 'in_progress', ?3, ?4, ?5, ?6, ?7, ?4, ?8)",
        )
        .bind(key)
        .bind(fingerprint().digest.to_vec())
        .bind(token.0)
        .bind(lease_end)
        .bind(START - 60_000)
        .bind(START + 3_600_000)
        .bind(1u128.to_be_bytes().to_vec())
        .bind(steps)
        .execute(&pool)
        .await
        .unwrap();
    }
    pool.close().await;

    let store = SqliteStore::connect_with_clock(&path, Arc::new(clock.clone()))
        .await
        .expect("open upgrades the file");
    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _idempotent_sqlite_migrations ORDER BY version")
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert_eq!(applied, [1, 2, 3, 4]);
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM idempotency_records ORDER BY key")
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert_eq!(versions, [0, 0, 0], "existing records start at version 0");
    let request = |key, token| ClaimRequest {
        key,
        ..claim_request(token)
    };
    assert_eq!(
        store
            .claim(&request("key-1", FencingToken::random()))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::Replay(stored.clone())
    );
    assert!(matches!(
        store
            .claim(&request("key-2", FencingToken::random()))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::InProgress { .. }
    ));
    assert!(
        store
            .record_step("acct_alice", "key-2", running, &step)
            .await
            .unwrap()
    );
    assert!(
        store
            .complete("acct_alice", "key-2", running, &stored)
            .await
            .unwrap()
    );
    let retry = FencingToken::random();
    assert_eq!(
        store.claim(&request("key-3", retry)).await.unwrap().outcome,
        ClaimOutcome::Claimed {
            token: retry,
            takeover: Some(idempotent_runtime::store::Takeover::LeaseLost),
            steps: vec![step],
        }
    );

    // An earlier release's writes: an update fenced by token alone, and an insert.
    let version_of = |key: &'static str| {
        sqlx::query_scalar::<_, i64>(
            "SELECT version FROM idempotency_records WHERE scope = 'acct_alice' AND key = ?1",
        )
        .bind(key)
        .fetch_one(store.pool())
    };
    let before = version_of("key-3").await.unwrap();
    sqlx::query("UPDATE idempotency_records SET lease_expires_at = lease_expires_at + 1 WHERE key = 'key-3'")
        .execute(store.pool())
        .await
        .unwrap();
    assert_eq!(version_of("key-3").await.unwrap(), before.wrapping_add(1));
    assert!(
        !store
            .complete("acct_alice", "key-3", FencingToken::random(), &stored)
            .await
            .unwrap(),
        "a stranger owns nothing"
    );
    assert!(
        store
            .complete("acct_alice", "key-3", retry, &stored)
            .await
            .unwrap(),
        "the owner's compare-and-set reads the moved version and completes"
    );
    sqlx::query(
        "INSERT INTO idempotency_records (scope, key, fingerprint, fingerprint_version, \
         state, token, lease_expires_at, created_at, expires_at) \
         VALUES ('acct_alice', 'key-4', ?1, 1, 'in_progress', 9, ?2, ?2, ?2)",
    )
    .bind(fingerprint().digest.to_vec())
    .bind(START)
    .execute(store.pool())
    .await
    .unwrap();
    assert_ne!(
        version_of("key-4").await.unwrap(),
        0,
        "an earlier release's insert gets a random version"
    );
}

async fn concurrent_first_opens_of_one_file_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let path = path_in(&dir, "race.db");
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let path = path.clone();
            tokio::spawn(async move { SqliteStore::connect(&path).await })
        })
        .collect();
    for open in opens {
        open.await.unwrap().expect("concurrent open");
    }
}

async fn the_store_uses_wal_a_busy_timeout_and_full_sync() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::connect(&path_in(&dir, "pragmas.db"))
        .await
        .unwrap();
    let mut conn = store.pool().acquire().await.unwrap();
    let mode: String = sqlx::query("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .get(0);
    assert_eq!(mode, "wal");
    let busy: i64 = sqlx::query("PRAGMA busy_timeout")
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .get(0);
    assert_eq!(busy, 5000);
    let sync: i64 = sqlx::query("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .get(0);
    assert_eq!(sync, 2, "FULL: a commit survives a power loss");
}

async fn times_are_milliseconds_from_the_injected_clock() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at_millis(START);
    let store =
        SqliteStore::connect_with_clock(&path_in(&dir, "clock.db"), Arc::new(clock.clone()))
            .await
            .unwrap();
    assert!(matches!(
        store
            .claim(&claim_request(FencingToken::random()))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::Claimed { .. }
    ));
    let row = sqlx::query(
        "SELECT created_at, lease_expires_at, expires_at, fingerprint, fingerprint_version \
         FROM idempotency_records",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(row.get::<i64, _>("created_at"), START);
    assert_eq!(row.get::<i64, _>("lease_expires_at"), START + 30_000);
    assert_eq!(row.get::<i64, _>("expires_at"), START + 3_600_000);
    assert_eq!(
        row.get::<Vec<u8>, _>("fingerprint"),
        fingerprint().digest.to_vec()
    );
    assert_eq!(row.get::<i64, _>("fingerprint_version"), 1);
}

async fn an_app_can_share_its_pool_with_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteStore::connect_options(&path_in(&dir, "shared.db")).unwrap();
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    // The app's own table (and, in real apps, its own migrations) live beside the store's.
    sqlx::query("CREATE TABLE charges (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let store =
        SqliteStore::from_pool_with_clock(pool.clone(), Arc::new(ManualClock::at_millis(START)))
            .await
            .unwrap();
    assert!(matches!(
        store
            .claim(&claim_request(FencingToken::random()))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::Claimed { .. }
    ));
    let records: i64 = sqlx::query("SELECT COUNT(*) FROM idempotency_records")
        .fetch_one(&pool)
        .await
        .unwrap()
        .get(0);
    assert_eq!(records, 1);
    let tables: i64 = sqlx::query(
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
    )
    .fetch_one(&pool)
    .await
    .unwrap()
    .get(0);
    assert_eq!(
        tables, 0,
        "the store leaves sqlx's default migrations table to the app"
    );
}

async fn a_corrupt_record_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::connect(&path_in(&dir, "corrupt.db"))
        .await
        .unwrap();
    let token = FencingToken::random();
    store.claim(&claim_request(token)).await.unwrap();
    let response = StoredResponse {
        status: 200,
        headers: Vec::new(),
        body: None,
    };
    assert!(
        store
            .complete("acct_alice", "key-1", token, &response)
            .await
            .unwrap()
    );
    sqlx::query("UPDATE idempotency_records SET headers = x'0000'")
        .execute(store.pool())
        .await
        .unwrap();
    assert!(matches!(
        store
            .claim(&claim_request(FencingToken::random()))
            .await
            .map(|answer| answer.outcome),
        Err(StoreError::Corrupt(_))
    ));
}
