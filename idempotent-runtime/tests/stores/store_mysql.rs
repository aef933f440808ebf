//! The conformance and transactional suites on [`MySqlStore`], plus what only MySQL has:
//! connection errors, concurrent migrations, the database clock, replays that write
//! nothing, the in-place upgrades (recorded steps from v1, record versions from v3 with
//! live records), the packet limit and the round trips of each operation. Several pools
//! (instances) on one database race in the conformance suite's `check_instances_…`.
//!
//! Needs `IDEMPOTENT_TEST_MYSQL_URL` (e.g. `mysql://root@127.0.0.1:3306/test`; MySQL 8
//! or MariaDB 10.6+); without it every database test is reported *ignored* (the reason
//! printed once). Each test works in a fresh database with a random name, dropped again
//! when the test ends, so tests run in parallel and leave nothing behind.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idempotent_runtime::store::RecordStore;
use idempotent_runtime::store::{ClaimOutcome, ClaimRequest, FencingToken, StoredResponse};
use idempotent_runtime::store::{MySqlStore, RecordedStep, encode_headers, encode_step};
use idempotent_runtime::testing::conformance::{self, Harness, RecordsHarness};
use idempotent_runtime::testing::{Trial, async_trial, ignored_if};
use idempotent_runtime::{Fingerprint, RecordState, Store, StoreError};
use sha2::{Digest, Sha256};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Row, SqlSafeStr};

use crate::fixtures::{FINGERPRINT, LEASE, TTL, claim_request, must_resume};
use crate::transaction;

const URL_VAR: &str = "IDEMPOTENT_TEST_MYSQL_URL";

/// Test databases are named `idem_test_<unix seconds>_<random>`.
const DATABASE_PREFIX: &str = "idem_test_";

/// Why the database tests cannot run here, if they cannot.
fn unavailable() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => None,
        _ => Some(format!(
            "{URL_VAR} is not set (e.g. mysql://root@127.0.0.1:3306/test)"
        )),
    }
}

/// The server's URL; only called by tests that run when [`unavailable`] said nothing.
fn server_url() -> String {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => url,
        _ => panic!("{URL_VAR} is not set"),
    }
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// `url` with its database replaced by `database`.
fn url_for_database(url: &str, database: &str) -> String {
    let mut parsed = url::Url::parse(url).unwrap_or_else(|e| panic!("{URL_VAR}: {e}"));
    parsed.set_path(&format!("/{database}"));
    parsed.into()
}

async fn admin_connection(url: &str) -> MySqlConnection {
    MySqlConnection::connect(url)
        .await
        .unwrap_or_else(|e| panic!("{URL_VAR} is set but unreachable: {e}"))
}

/// A database that exists for one test: created at once, dropped (with everything in
/// it) when the guard is dropped.
struct TestDatabase {
    server_url: String,
    name: String,
}

impl TestDatabase {
    /// A fresh, empty database. Also drops databases that crashed earlier runs left
    /// behind (older than an hour), once per test binary.
    async fn new() -> Self {
        let server_url = server_url();
        static SWEPT: AtomicBool = AtomicBool::new(false);
        let mut admin = admin_connection(&server_url).await;
        if !SWEPT.swap(true, Ordering::SeqCst) {
            sweep_stale_databases(&mut admin).await;
        }
        let name = format!(
            "{DATABASE_PREFIX}{}_{:016x}",
            unix_secs(),
            rand::random::<u64>()
        );
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
            .execute(&mut admin)
            .await
            .expect("create the test database");
        let _ = admin.close().await;
        Self { server_url, name }
    }

    /// The URL of this database.
    fn url(&self) -> String {
        url_for_database(&self.server_url, &self.name)
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // Drop cannot await, and the test's runtime may be shutting down: run the cleanup
        // on a thread of its own with its own runtime, and wait for it.
        let url = self.server_url.clone();
        let name = self.name.clone();
        let outcome = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let mut conn = MySqlConnection::connect(&url)
                    .await
                    .map_err(|e| e.to_string())?;
                sqlx::query(AssertSqlSafe(format!("DROP DATABASE IF EXISTS `{name}`")))
                    .execute(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                let _ = conn.close().await;
                Ok::<(), String>(())
            })
        })
        .join();
        match outcome {
            Ok(Ok(())) => {}
            // Never panic in Drop (the test may already be unwinding); say it loudly.
            Ok(Err(e)) => eprintln!("warning: could not drop test database {}: {e}", self.name),
            Err(_) => eprintln!("warning: cleanup of test database {} panicked", self.name),
        }
    }
}

/// Drops `idem_test_*` databases older than an hour (left by a crashed or killed run).
async fn sweep_stale_databases(admin: &mut MySqlConnection) {
    let Ok(names) = sqlx::query_scalar::<_, String>(
        "SELECT CAST(schema_name AS CHAR) FROM information_schema.schemata \
         WHERE schema_name LIKE 'idem\\_test\\_%'",
    )
    .fetch_all(&mut *admin)
    .await
    else {
        return;
    };
    let cutoff = unix_secs().saturating_sub(3600);
    for name in names {
        let created = name
            .strip_prefix(DATABASE_PREFIX)
            .and_then(|rest| rest.split('_').next())
            .and_then(|secs| secs.parse::<u64>().ok());
        if created.is_some_and(|secs| secs < cutoff) {
            let _ = sqlx::query(AssertSqlSafe(format!("DROP DATABASE IF EXISTS `{name}`")))
                .execute(&mut *admin)
                .await;
        }
    }
}

/// A fresh [`MySqlStore`] in its own database (so are the tables the transactional
/// suite's ledger creates). Time moves by shifting the stored timestamps back, which to
/// the store (deciding by the database's `UTC_TIMESTAMP(6)`) is the same as the database
/// clock moving forward.
struct MySqlHarness {
    store: Arc<MySqlStore>,
    // Dropped after the store's pool (fields drop in order).
    database: TestDatabase,
}

#[async_trait::async_trait]
impl Harness for MySqlHarness {
    fn unavailable() -> Option<String> {
        unavailable()
    }

    async fn new() -> Self {
        let database = TestDatabase::new().await;
        let store = MySqlStore::connect(&database.url())
            .await
            .unwrap_or_else(|e| panic!("{URL_VAR} is set but the store cannot open: {e}"));
        Self {
            store: Arc::new(store),
            database,
        }
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn advance(&self, by: Duration) {
        let micros = i64::try_from(by.as_micros()).expect("test durations fit");
        sqlx::query(
            "UPDATE idempotency_records SET \
             expires_at = expires_at - INTERVAL ? MICROSECOND, \
             lease_expires_at = lease_expires_at - INTERVAL ? MICROSECOND, \
             created_at = created_at - INTERVAL ? MICROSECOND",
        )
        .bind(micros)
        .bind(micros)
        .bind(micros)
        .execute(self.store.pool())
        .await
        .expect("shift timestamps");
    }

    async fn another_store(&self) -> Option<Arc<dyn Store>> {
        let store = MySqlStore::connect(&self.database.url())
            .await
            .unwrap_or_else(|e| panic!("{URL_VAR} is set but another store cannot open: {e}"));
        Some(Arc::new(store))
    }
}

impl RecordsHarness for MySqlHarness {
    fn records(&self) -> &dyn RecordStore {
        self.store.records()
    }
}

pub(crate) fn trials() -> Vec<Trial> {
    let mut trials = conformance::trials::<MySqlHarness>();
    trials.extend(conformance::record_trials::<MySqlHarness>());
    trials.extend(transaction::trials::<MySqlHarness, sqlx::MySql>());
    // Without a database.
    trials.push(async_trial(
        "unreachable_server_is_an_open_error_naming_the_redacted_url",
        unreachable_server_is_an_open_error_naming_the_redacted_url,
    ));
    let with_database: Vec<Trial> = vec![
        async_trial(
            "concurrent_starts_migrate_one_fresh_database_once",
            concurrent_starts_migrate_one_fresh_database_once,
        ),
        async_trial(
            "timestamps_come_from_the_database_clock",
            timestamps_come_from_the_database_clock,
        ),
        async_trial(
            "the_session_time_zone_does_not_matter",
            the_session_time_zone_does_not_matter,
        ),
        async_trial(
            "replays_duplicates_and_mismatches_write_nothing",
            replays_duplicates_and_mismatches_write_nothing,
        ),
        async_trial(
            "shares_a_pool_and_uses_its_own_migrations_table",
            shares_a_pool_and_uses_its_own_migrations_table,
        ),
        async_trial(
            "a_claim_and_a_completion_are_one_request_each_and_batches_share_one",
            a_claim_and_a_completion_are_one_request_each_and_batches_share_one,
        ),
        async_trial(
            "a_scope_too_long_for_its_column_is_refused_not_cut_short",
            a_scope_too_long_for_its_column_is_refused_not_cut_short,
        ),
        async_trial(
            "batched_completions_of_every_byte_value_replay_exactly",
            batched_completions_of_every_byte_value_replay_exactly,
        ),
        async_trial(
            "purge_leaves_records_claimed_again",
            purge_leaves_records_claimed_again,
        ),
        async_trial(
            "records_lie_in_the_order_they_were_claimed",
            records_lie_in_the_order_they_were_claimed,
        ),
        async_trial(
            "test_databases_are_dropped_when_the_harness_is",
            test_databases_are_dropped_when_the_harness_is,
        ),
        async_trial(
            "debug_names_the_location_without_a_password",
            debug_names_the_location_without_a_password,
        ),
        async_trial(
            "upgrades_a_v1_database_in_place",
            upgrades_a_v1_database_in_place,
        ),
        async_trial(
            "upgrades_a_version_3_database_with_live_records_in_place",
            upgrades_a_version_3_database_with_live_records_in_place,
        ),
        async_trial(
            "a_step_past_max_allowed_packet_is_refused_and_the_steps_kept",
            a_step_past_max_allowed_packet_is_refused_and_the_steps_kept,
        ),
        async_trial(
            "a_step_recorded_in_a_transaction_commits_or_rolls_back_with_it",
            a_step_recorded_in_a_transaction_commits_or_rolls_back_with_it,
        ),
        async_trial(
            "each_operation_costs_its_round_trips",
            each_operation_costs_its_round_trips,
        ),
    ];
    trials.extend(ignored_if(unavailable(), with_database));
    trials
}

async fn unreachable_server_is_an_open_error_naming_the_redacted_url() {
    // Needs no database: nothing listens on port 1.
    for (url, shown) in [
        (
            "mysql://idem_user:hunter2@127.0.0.1:1/payments",
            "mysql://idem_user:***@127.0.0.1:1/payments",
        ),
        (
            "mysql://idem_user@127.0.0.1:1/payments?password=hunter2",
            "mysql://idem_user@127.0.0.1:1/payments?password=***",
        ),
    ] {
        let error = MySqlStore::connect(url)
            .await
            .expect_err("nothing listens on port 1");
        let message = error.to_string();
        match &error {
            StoreError::Open { location, reason } => {
                assert_eq!(location, shown);
                assert!(!reason.is_empty());
            }
            other => panic!("expected StoreError::Open, got {other:?}"),
        }
        assert!(message.contains(shown), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
        assert!(!format!("{error:?}").contains("hunter2"));
    }
}

async fn concurrent_starts_migrate_one_fresh_database_once() {
    let database = TestDatabase::new().await;
    let url = database.url();
    let starts = (0..4).map(|_| MySqlStore::connect(&url));
    let stores: Vec<MySqlStore> = futures_util::future::join_all(starts)
        .await
        .into_iter()
        .map(|started| started.expect("every concurrent start succeeds"))
        .collect();

    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _idempotent_migrations ORDER BY version")
            .fetch_all(stores[0].pool())
            .await
            .expect("migrations table");
    assert_eq!(
        applied,
        vec![1, 2, 3, 4],
        "each migration applied exactly once"
    );

    // All of them see one table.
    let token = FencingToken::random();
    assert_eq!(
        stores[0]
            .claim(&claim_request("k", token))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::Claimed {
            token,
            takeover: None,
            steps: Vec::new(),
        }
    );
    for store in &stores[1..] {
        let outcome = store
            .claim(&claim_request("k", FencingToken::random()))
            .await
            .unwrap()
            .outcome;
        assert!(
            matches!(outcome, ClaimOutcome::InProgress { .. }),
            "{outcome:?}"
        );
    }
}

async fn timestamps_come_from_the_database_clock() {
    let database = TestDatabase::new().await;
    let store = MySqlStore::connect(&database.url()).await.unwrap();
    let token = FencingToken::random();
    store.claim(&claim_request("clock", token)).await.unwrap();
    let row = sqlx::query(
        "SELECT TIMESTAMPDIFF(MICROSECOND, created_at, expires_at) AS ttl,
                TIMESTAMPDIFF(MICROSECOND, created_at, lease_expires_at) AS lease,
                ABS(TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6))) AS age,
                state, token
         FROM idempotency_records WHERE scope = 'acct_alice' AND `key` = 'clock'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(row.get::<i64, _>("ttl"), TTL.as_micros() as i64);
    assert_eq!(row.get::<i64, _>("lease"), LEASE.as_micros() as i64);
    assert!(
        row.get::<i64, _>("age") < 5_000_000,
        "created_at is the database's UTC_TIMESTAMP(6)"
    );
    assert_eq!(row.get::<String, _>("state"), "in_progress");
    assert_eq!(row.get::<i64, _>("token"), token.0);

    // A renew moves the lease from the database's clock, exactly, to the microsecond.
    assert!(
        store
            .renew(
                "acct_alice",
                "clock",
                token,
                Duration::from_millis(1500),
                TTL
            )
            .await
            .unwrap()
    );
    let remaining: i64 = sqlx::query_scalar(
        "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_expires_at) \
         FROM idempotency_records WHERE scope = 'acct_alice' AND `key` = 'clock'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert!(remaining > 500_000 && remaining <= 1_500_000, "{remaining}");
}

/// Two pools whose sessions are in time zones 24 hours apart decide the same: the store
/// uses UTC_TIMESTAMP(6) and DATETIME, never the session's NOW().
async fn the_session_time_zone_does_not_matter() {
    let database = TestDatabase::new().await;
    let options: MySqlConnectOptions = database.url().parse().unwrap();
    let pool_in = |zone: &str| {
        MySqlPoolOptions::new()
            .max_connections(2)
            .connect_with(options.clone().timezone(Some(zone.to_owned())))
    };
    let east = MySqlStore::from_pool(pool_in("+13:00").await.unwrap())
        .await
        .unwrap();
    let west = MySqlStore::from_pool(pool_in("-11:00").await.unwrap())
        .await
        .unwrap();
    let token = FencingToken::random();
    assert_eq!(
        east.claim(&claim_request("tz", token))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::Claimed {
            token,
            takeover: None,
            steps: Vec::new(),
        }
    );
    // Seen from 24 hours "earlier", the lease is neither expired nor a day long.
    match west
        .claim(&claim_request("tz", FencingToken::random()))
        .await
        .unwrap()
        .outcome
    {
        ClaimOutcome::InProgress { retry_after } => {
            assert!(retry_after <= LEASE, "{retry_after:?}")
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
    assert!(
        west.renew("acct_alice", "tz", token, LEASE, TTL)
            .await
            .unwrap()
    );
}

async fn replays_duplicates_and_mismatches_write_nothing() {
    let database = TestDatabase::new().await;
    let store = MySqlStore::connect(&database.url()).await.unwrap();
    // Every row the store inserts, updates or deletes is logged by a trigger (AFTER
    // triggers fire only for rows actually written; a duplicate-key insert writes none).
    sqlx::raw_sql(
        "CREATE TABLE write_log (op VARCHAR(8) NOT NULL);
         CREATE TRIGGER log_insert AFTER INSERT ON idempotency_records
             FOR EACH ROW INSERT INTO write_log VALUES ('insert');
         CREATE TRIGGER log_update AFTER UPDATE ON idempotency_records
             FOR EACH ROW INSERT INTO write_log VALUES ('update');
         CREATE TRIGGER log_delete AFTER DELETE ON idempotency_records
             FOR EACH ROW INSERT INTO write_log VALUES ('delete');",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let writes = || {
        let pool = store.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM write_log")
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let other = Fingerprint {
        version: 1,
        digest: [9; 32],
    };
    let mismatch = |key: &'static str| ClaimRequest {
        fingerprint: &other,
        ..claim_request(key, FencingToken::random())
    };

    let token = FencingToken::random();
    store.claim(&claim_request("running", token)).await.unwrap();
    assert_eq!(writes().await, 1, "the claim inserted its record");
    let duplicate = store
        .claim(&claim_request("running", FencingToken::random()))
        .await
        .unwrap()
        .outcome;
    assert!(matches!(duplicate, ClaimOutcome::InProgress { .. }));
    assert_eq!(
        store.claim(&mismatch("running")).await.unwrap().outcome,
        ClaimOutcome::Mismatch
    );
    assert_eq!(writes().await, 1, "in progress: nothing written");

    assert!(
        store
            .complete(
                "acct_alice",
                "running",
                token,
                &StoredResponse {
                    status: 201,
                    headers: Vec::new(),
                    body: None,
                },
            )
            .await
            .unwrap()
    );
    assert_eq!(writes().await, 2, "the completion updated it");
    for _ in 0..3 {
        let replay = store
            .claim(&claim_request("running", FencingToken::random()))
            .await
            .unwrap()
            .outcome;
        assert!(matches!(replay, ClaimOutcome::Replay(_)));
    }
    assert_eq!(
        store.claim(&mismatch("running")).await.unwrap().outcome,
        ClaimOutcome::Mismatch
    );
    assert_eq!(writes().await, 2, "completed: nothing written");
}

async fn shares_a_pool_and_uses_its_own_migrations_table() {
    let database = TestDatabase::new().await;
    let app_pool = MySqlPoolOptions::new()
        .max_connections(3)
        .connect(&database.url())
        .await
        .unwrap();
    // The app's own sqlx migrations in the same database, before and after the store's.
    sqlx::query("CREATE TABLE _sqlx_migrations (version BIGINT PRIMARY KEY)")
        .execute(&app_pool)
        .await
        .unwrap();
    let store = MySqlStore::from_pool(app_pool.clone()).await.unwrap();
    let token = FencingToken::random();
    assert_eq!(
        store
            .claim(&claim_request("shared", token))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::Claimed {
            token,
            takeover: None,
            steps: Vec::new(),
        }
    );
    let mut tables: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(table_name AS CHAR) FROM information_schema.tables \
         WHERE table_schema = DATABASE()",
    )
    .fetch_all(&app_pool)
    .await
    .unwrap();
    tables.sort();
    assert_eq!(
        tables,
        [
            "_idempotent_migrations",
            "_sqlx_migrations",
            "idempotency_records"
        ]
    );
    // A second store on the same pool finds everything applied.
    let again = MySqlStore::from_pool(app_pool.clone()).await.unwrap();
    let outcome = again
        .claim(&claim_request("shared", FencingToken::random()))
        .await
        .unwrap()
        .outcome;
    assert!(
        matches!(outcome, ClaimOutcome::InProgress { .. }),
        "{outcome:?}"
    );
    // The app's pool is still usable.
    let one: i64 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&app_pool)
        .await
        .unwrap();
    assert_eq!(one, 1);
}

/// Counts the commands a client sends to the MySQL server: a TCP proxy on loopback in
/// front of the server that reads the client's side of the protocol packet by packet. A
/// packet with sequence number 0 starts a command (a query, a prepared statement's
/// execution, a ping); the handshake's packets have others. One command is one round
/// trip.
struct CommandCounter {
    commands: Arc<std::sync::atomic::AtomicUsize>,
    /// The commands other than `COM_PING`, which sqlx sends on its own (in the
    /// background) for every connection handed back to a pool.
    statements: Arc<std::sync::atomic::AtomicUsize>,
    /// The server's URL with the proxy's address (and TLS off, so packets can be read).
    url: String,
}

impl CommandCounter {
    async fn in_front_of(url: &str) -> Self {
        let mut parsed = url::Url::parse(url).unwrap();
        let upstream = format!(
            "{}:{}",
            parsed.host_str().unwrap(),
            parsed.port().unwrap_or(3306)
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = listener.local_addr().unwrap();
        parsed.set_host(Some("127.0.0.1")).unwrap();
        parsed.set_port(Some(proxy.port())).unwrap();
        parsed.query_pairs_mut().append_pair("ssl-mode", "disabled");
        let commands = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let statements = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = (commands.clone(), statements.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                let counted = counted.clone();
                tokio::spawn(pump(client_read, server_write, Some(counted)));
                tokio::spawn(pump(server_read, client_write, None));
            }
        });
        Self {
            commands,
            statements,
            url: parsed.into(),
        }
    }

    fn commands(&self) -> usize {
        self.commands.load(Ordering::SeqCst)
    }

    fn statements(&self) -> usize {
        self.statements.load(Ordering::SeqCst)
    }
}

/// Copies `from` to `to` until either closes; with `counters` (commands, statements),
/// counts the packets with sequence number 0 in what it copies, and of those the ones
/// whose command byte is not `COM_PING`.
async fn pump(
    from: tokio::net::tcp::OwnedReadHalf,
    to: tokio::net::tcp::OwnedWriteHalf,
    counters: Option<(
        Arc<std::sync::atomic::AtomicUsize>,
        Arc<std::sync::atomic::AtomicUsize>,
    )>,
) {
    const COM_PING: u8 = 0x0e;
    let mut buf = vec![0u8; 64 * 1024];
    // The packet header being read (3 bytes of length, 1 of sequence), then the bytes of
    // payload left to skip.
    let mut header = Vec::with_capacity(4);
    let mut payload_left = 0usize;
    // The next payload byte is a command's first: its type.
    let mut command_byte_next = false;
    loop {
        if from.readable().await.is_err() {
            return;
        }
        let n = match from.try_read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        };
        if let Some((commands, statements)) = &counters {
            for &byte in &buf[..n] {
                if payload_left > 0 {
                    if std::mem::take(&mut command_byte_next) && byte != COM_PING {
                        statements.fetch_add(1, Ordering::SeqCst);
                    }
                    payload_left -= 1;
                    continue;
                }
                header.push(byte);
                if header.len() == 4 {
                    payload_left = usize::from(header[0])
                        | usize::from(header[1]) << 8
                        | usize::from(header[2]) << 16;
                    if header[3] == 0 {
                        commands.fetch_add(1, Ordering::SeqCst);
                        command_byte_next = true;
                    }
                    header.clear();
                }
            }
        }
        let mut sent = 0;
        while sent < n {
            if to.writable().await.is_err() {
                return;
            }
            match to.try_write(&buf[sent..n]) {
                Ok(written) => sent += written,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => return,
            }
        }
    }
}

/// Round trips, counted as the commands the store sends: a fresh key's claim and its
/// completion are one each, a replay and a duplicate one; and 64 concurrent fresh keys
/// share a few requests for their claims and a few for their completions (group
/// commit), where one request per claim would be 64 at least.
async fn a_claim_and_a_completion_are_one_request_each_and_batches_share_one() {
    let database = TestDatabase::new().await;
    let counter = CommandCounter::in_front_of(&database.url()).await;
    let store = Arc::new(MySqlStore::connect(&counter.url).await.unwrap());
    let response = StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: Some(bytes::Bytes::from_static(b"{\"id\":1}")),
    };
    // Opens the connections the store keeps, so what follows counts statements only.
    let token = FencingToken::random();
    store.claim(&claim_request("warm-up", token)).await.unwrap();
    assert!(
        store
            .complete("acct_alice", "warm-up", token, &response)
            .await
            .unwrap()
    );

    let before = counter.commands();
    let token = FencingToken::random();
    let claimed = store.claim(&claim_request("alone", token)).await.unwrap();
    assert_eq!(
        claimed.outcome,
        ClaimOutcome::Claimed {
            token,
            takeover: None,
            steps: Vec::new(),
        }
    );
    assert_eq!(counter.commands() - before, 1, "a fresh key's claim");
    let before = counter.commands();
    let duplicate = store
        .claim(&claim_request("alone", FencingToken::random()))
        .await
        .unwrap();
    assert!(matches!(duplicate.outcome, ClaimOutcome::InProgress { .. }));
    assert_eq!(counter.commands() - before, 1, "an in-progress duplicate");
    let before = counter.commands();
    assert!(
        store
            .complete("acct_alice", "alone", token, &response)
            .await
            .unwrap()
    );
    assert_eq!(counter.commands() - before, 1, "a completion");
    let before = counter.commands();
    let replay = store
        .claim(&claim_request("alone", FencingToken::random()))
        .await
        .unwrap();
    assert_eq!(replay.outcome, ClaimOutcome::Replay(response.clone()));
    assert_eq!(counter.commands() - before, 1, "a replay");

    const KEYS: usize = 64;
    let before = counter.commands();
    let barrier = Arc::new(tokio::sync::Barrier::new(KEYS));
    let claims: Vec<_> = (0..KEYS)
        .map(|i| {
            let store = store.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                let key = format!("fresh-{i}");
                let token = FencingToken::random();
                barrier.wait().await;
                let answer = store.claim(&claim_request(&key, token)).await.unwrap();
                assert_eq!(
                    answer.outcome,
                    ClaimOutcome::Claimed {
                        token,
                        takeover: None,
                        steps: Vec::new(),
                    }
                );
                (key, token)
            })
        })
        .collect();
    let mut claimed = Vec::new();
    for claim in claims {
        claimed.push(claim.await.unwrap());
    }
    let claim_requests = counter.commands() - before;
    let before = counter.commands();
    let barrier = Arc::new(tokio::sync::Barrier::new(KEYS));
    let completions: Vec<_> = claimed
        .into_iter()
        .map(|(key, token)| {
            let store = store.clone();
            let barrier = barrier.clone();
            let response = response.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                store
                    .complete("acct_alice", &key, token, &response)
                    .await
                    .unwrap()
            })
        })
        .collect();
    for completion in completions {
        assert!(completion.await.unwrap(), "each completion took effect");
    }
    let completion_requests = counter.commands() - before;
    // A batch takes what is waiting when the previous one finishes; 64 callers released
    // at once fill a few batches, far below one request each.
    assert!(
        (1..=KEYS / 4).contains(&claim_requests),
        "{claim_requests} requests for {KEYS} concurrent claims"
    );
    assert!(
        (1..=KEYS / 4).contains(&completion_requests),
        "{completion_requests} requests for {KEYS} concurrent completions"
    );
}

/// The claim inserts with `INSERT IGNORE`, which would store a value too long for its
/// `BLOB` column cut short (with a warning) instead of failing: such a scope is refused
/// before it is sent, and nothing is stored.
async fn a_scope_too_long_for_its_column_is_refused_not_cut_short() {
    let harness = MySqlHarness::new().await;
    let scope = "s".repeat(65_536);
    let claim = ClaimRequest {
        scope: &scope,
        ..claim_request("k", FencingToken::random())
    };
    let error = harness.store.claim(&claim).await.expect_err("too long");
    assert!(error.to_string().contains("65536 bytes"), "{error}");
    let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idempotency_records")
        .fetch_one(harness.store.pool())
        .await
        .unwrap();
    assert_eq!(stored, 0, "nothing stored, not even cut short");
    // The longest that fits is stored whole.
    let scope = "s".repeat(65_535);
    let token = FencingToken::random();
    let claim = ClaimRequest {
        scope: &scope,
        ..claim_request("k", token)
    };
    assert_eq!(
        harness.store.claim(&claim).await.unwrap().outcome,
        ClaimOutcome::Claimed {
            token,
            takeover: None,
            steps: Vec::new(),
        }
    );
}

/// Responses travel inside a batch's text as hexadecimal literals: concurrent
/// completions of bodies of every byte value, up to just under a batch's byte limit,
/// replay exactly.
async fn batched_completions_of_every_byte_value_replay_exactly() {
    let harness = MySqlHarness::new().await;
    let store = harness.store.clone();
    let sizes = [0usize, 1, 255, 256, 4096, 500 * 1024];
    let tasks: Vec<_> = sizes
        .iter()
        .map(|&size| {
            let store = store.clone();
            tokio::spawn(async move {
                let key = format!("body-{size}");
                let token = FencingToken::random();
                store.claim(&claim_request(&key, token)).await.unwrap();
                let body: Vec<u8> = (0..size).map(|i| (i % 256) as u8).collect();
                let response = StoredResponse {
                    status: 200,
                    headers: vec![("x-bytes".into(), (0..=255u8).collect())],
                    body: Some(body.into()),
                };
                assert!(
                    store
                        .complete("acct_alice", &key, token, &response)
                        .await
                        .unwrap()
                );
                let replay = store
                    .claim(&claim_request(&key, FencingToken::random()))
                    .await
                    .unwrap()
                    .outcome;
                assert_eq!(replay, ClaimOutcome::Replay(response), "{size} bytes");
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// A purge racing a claim: a record claimed again between the purge's read and its
/// delete is kept (the delete re-checks expiry on the locked row).
async fn purge_leaves_records_claimed_again() {
    let harness = MySqlHarness::new().await;
    let store = harness.store.clone();
    let stored = StoredResponse {
        status: 200,
        headers: Vec::new(),
        body: None,
    };
    for i in 0..20 {
        let key = format!("k{i}");
        let token = FencingToken::random();
        store.claim(&claim_request(&key, token)).await.unwrap();
        assert!(
            store
                .complete("acct_alice", &key, token, &stored)
                .await
                .unwrap()
        );
    }
    harness.advance(TTL).await;
    // Claimed again (expired takeover) while purges run: each ends up either purged
    // (then claimed as new) or taken over, never deleted from under its new owner.
    let purges = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut purged = 0;
            for _ in 0..20 {
                purged += store.purge_expired(1).await.unwrap();
            }
            purged
        })
    };
    let mut owners = Vec::new();
    for i in 0..20 {
        let key = format!("k{i}");
        let token = FencingToken::random();
        match store
            .claim(&claim_request(&key, token))
            .await
            .unwrap()
            .outcome
        {
            ClaimOutcome::Claimed { token: won, .. } => owners.push((key, won)),
            other => panic!("{key}: {other:?}"),
        }
    }
    let purged = purges.await.unwrap();
    assert!(purged <= 20);
    for (key, token) in owners {
        assert!(
            store
                .renew("acct_alice", &key, token, LEASE, TTL)
                .await
                .unwrap(),
            "{key}: the new owner still owns it"
        );
    }
    assert_eq!(store.purge_expired(100).await.unwrap(), 0);
}

/// Schema v3: the table is clustered by an id in claim order, not by the key's hash, so
/// new records fill the end of the table instead of random pages of it. Keys claimed one
/// after another lie in that order however their hashes sort, and a duplicate claim
/// between them (an insert InnoDB takes back) leaves no row behind.
async fn records_lie_in_the_order_they_were_claimed() {
    let harness = MySqlHarness::new().await;
    let store = harness.store.clone();
    let primary_key: String = sqlx::query_scalar(
        "SELECT GROUP_CONCAT(column_name ORDER BY seq_in_index) FROM information_schema.statistics
         WHERE table_schema = DATABASE() AND table_name = 'idempotency_records'
           AND index_name = 'PRIMARY'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(primary_key, "id");

    let keys: Vec<String> = (0..12).map(|i| format!("order-{i}")).collect();
    let hashes: Vec<Vec<u8>> = keys
        .iter()
        .map(|key| record_id("acct_alice", key))
        .collect();
    assert!(
        !hashes.is_sorted(),
        "the keys' hashes sort in another order than the claims"
    );
    for key in &keys {
        let token = FencingToken::random();
        store.claim(&claim_request(key, token)).await.unwrap();
        // A duplicate between claims takes no place in the order.
        store
            .claim(&claim_request(key, FencingToken::random()))
            .await
            .unwrap();
    }
    let stored: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT `key` FROM idempotency_records ORDER BY id")
            .fetch_all(store.pool())
            .await
            .unwrap();
    let expected: Vec<Vec<u8>> = keys.iter().map(|key| key.as_bytes().to_vec()).collect();
    assert_eq!(stored, expected);
}

async fn test_databases_are_dropped_when_the_harness_is() {
    let url = server_url();
    let harness = MySqlHarness::new().await;
    let name = harness.database.name.clone();
    let exists = |url: String, name: String| async move {
        let mut conn = admin_connection(&url).await;
        let found: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?",
        )
        .bind(name)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        let _ = conn.close().await;
        found == 1
    };
    assert!(exists(url.clone(), name.clone()).await);
    drop(harness);
    assert!(!exists(url, name).await, "the database was dropped");
}

async fn debug_names_the_location_without_a_password() {
    let database = TestDatabase::new().await;
    let store = MySqlStore::connect(&database.url()).await.unwrap();
    let options: MySqlConnectOptions = database.url().parse().unwrap();
    let debug = format!("{store:?}");
    assert!(debug.contains(&database.name), "{debug}");
    assert!(debug.contains(options.get_host()), "{debug}");
    assert!(!debug.contains("password"), "{debug}");
}

/// A step named `name` with `output`, recorded at a whole millisecond (what the encoding
/// keeps).
fn step(name: &str, output: &[u8]) -> RecordedStep {
    RecordedStep {
        name: name.to_owned(),
        output: bytes::Bytes::copy_from_slice(output),
        recorded_at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
    }
}

/// The primary key the store computes: SHA-256 over the scope's byte length (8 bytes,
/// big-endian), the scope and the key.
fn record_id(scope: &str, key: &str) -> Vec<u8> {
    let mut hasher = Sha256::new();
    hasher.update((scope.len() as u64).to_be_bytes());
    hasher.update(scope.as_bytes());
    hasher.update(key.as_bytes());
    hasher.finalize().to_vec()
}

/// A database the previous release left (schema v1, applied by the same migrator into the
/// same table) holding a completed record and an in-progress one: opening the store adds
/// the steps column in place, the completed record still replays, the in-progress one is
/// still held by its token, takes steps, and a retry after its lease ran out takes it over
/// with them.
async fn upgrades_a_v1_database_in_place() {
    let database = TestDatabase::new().await;
    let mut conn = MySqlConnection::connect(&database.url()).await.unwrap();
    let v1 = Migration::new(
        1,
        "idempotency records".into(),
        MigrationType::Simple,
        include_str!("../../migrations/mysql/0001_idempotency_records.sql").into_sql_str(),
        false,
    );
    let mut migrator = Migrator::with_migrations(vec![v1]);
    migrator.dangerous_set_table_name(MySqlStore::MIGRATIONS_TABLE);
    migrator.set_locking(false);
    migrator.run(&mut conn).await.expect("schema v1");

    // The rows as the v1 store wrote them.
    let scope = "acct_alice";
    let response = StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: Some(bytes::Bytes::from_static(b"{\"id\":1}")),
    };
    let old = FencingToken::random();
    let insert = "INSERT INTO idempotency_records
         (scope_key_sha256, scope, `key`, fingerprint, fingerprint_version, state, token,
          lease_expires_at, status, headers, body, created_at, expires_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6) + INTERVAL 30 SECOND, ?, ?, ?,
                 UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)";
    sqlx::query(insert)
        .bind(record_id(scope, "done"))
        .bind(scope)
        .bind("done")
        .bind(&FINGERPRINT.digest[..])
        .bind(FINGERPRINT.version)
        .bind("completed")
        .bind(FencingToken::random().0)
        .bind(i16::try_from(response.status).unwrap())
        .bind(encode_headers(&response.headers))
        .bind(response.body.as_deref())
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query(insert)
        .bind(record_id(scope, "running"))
        .bind(scope)
        .bind("running")
        .bind(&FINGERPRINT.digest[..])
        .bind(FINGERPRINT.version)
        .bind("in_progress")
        .bind(old.0)
        .bind(None::<i16>)
        .bind(None::<Vec<u8>>)
        .bind(None::<Vec<u8>>)
        .execute(&mut conn)
        .await
        .unwrap();

    let store = MySqlStore::connect(&database.url()).await.expect("upgrade");
    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _idempotent_migrations ORDER BY version")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(applied, vec![1, 2, 3, 4]);
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idempotency_records")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(rows, 2, "no record lost");
    let ids: Vec<u64> = sqlx::query_scalar("SELECT id FROM idempotency_records ORDER BY id")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(ids.len(), 2, "v3 numbers the rows it finds: {ids:?}");

    assert_eq!(
        store
            .claim(&claim_request("done", FencingToken::random()))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::Replay(response),
        "the completed v1 record replays"
    );
    assert!(matches!(
        store
            .claim(&claim_request("running", FencingToken::random()))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::InProgress { .. }
    ));
    let charged = step("charge", br#"{"charge":"ch_1"}"#);
    assert!(
        store
            .record_step(scope, "running", old, &charged)
            .await
            .unwrap(),
        "the v1 claim's token records a step"
    );
    let info = store.inspect(scope, "running").await.unwrap().unwrap();
    assert_eq!(info.steps, vec![charged.clone()]);

    // The lease runs out; the retry takes the v1 record over with its step.
    sqlx::query(
        "UPDATE idempotency_records SET lease_expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND \
         WHERE `key` = 'running'",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    must_resume(&store, "running", vec![charged]).await;
    assert!(
        !store
            .record_step(scope, "running", old, &step("late", b"1"))
            .await
            .unwrap(),
        "the old token is fenced off"
    );
    let _ = conn.close().await;
}

/// The `version` of the record of `key`.
async fn version_of(conn: &mut MySqlConnection, key: &str) -> i64 {
    sqlx::query_scalar("SELECT version FROM idempotency_records WHERE `key` = ?")
        .bind(key)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// A database at schema v3 (the release before record versions) holding a completed
/// record, one in progress, one in progress with a step and one a release kept for its
/// step: the store adds the version column in place, and every record goes on through the
/// new store. The holders the earlier release's process left (their tokens unknown to
/// the new store) still renew, record steps and complete; a takeover resumes the steps
/// recorded before and after the upgrade; and writes in the earlier release's style
/// (fenced by token only, as an instance not yet upgraded writes) still move the version,
/// so an upgraded owner's compare-and-set never overwrites them.
async fn upgrades_a_version_3_database_with_live_records_in_place() {
    let database = TestDatabase::new().await;
    let mut conn = MySqlConnection::connect(&database.url()).await.unwrap();
    let earlier = [
        (
            1,
            "idempotency records",
            include_str!("../../migrations/mysql/0001_idempotency_records.sql"),
        ),
        (
            2,
            "recorded steps",
            include_str!("../../migrations/mysql/0002_recorded_steps.sql"),
        ),
        (
            3,
            "time ordered rows",
            include_str!("../../migrations/mysql/0003_time_ordered_rows.sql"),
        ),
    ];
    let mut migrator = Migrator::with_migrations(
        earlier
            .into_iter()
            .map(|(version, description, sql)| {
                Migration::new(
                    version,
                    description.into(),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    false,
                )
            })
            .collect(),
    );
    migrator.dangerous_set_table_name(MySqlStore::MIGRATIONS_TABLE);
    migrator.set_locking(false);
    migrator.run(&mut conn).await.expect("schema v3");

    let scope = "acct_alice";
    let response = StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: Some(bytes::Bytes::from_static(br#"{"id":"pay_1"}"#)),
    };
    let (running, stepping) = (FencingToken::random(), FencingToken::random());
    let (reserve, charge) = (step("reserve", b"r_1"), step("charge", b"ch_1"));
    // The rows as the v3 store wrote them: (key, state, token, lease left in seconds,
    // status, steps).
    let rows = [
        (
            "done",
            "completed",
            FencingToken::random(),
            0,
            Some(201),
            None,
        ),
        ("running", "in_progress", running, 30, None, None),
        (
            "stepping",
            "in_progress",
            stepping,
            30,
            None,
            Some(encode_step(&reserve)),
        ),
        (
            "released",
            "in_progress",
            FencingToken::RELEASED,
            0,
            None,
            Some(encode_step(&reserve)),
        ),
    ];
    for (key, state, token, lease_secs, status, steps) in rows {
        let completed = status.is_some();
        sqlx::query(
            "INSERT INTO idempotency_records
             (scope_key_sha256, scope, `key`, fingerprint, fingerprint_version, state, token,
              lease_expires_at, status, headers, body, created_at, expires_at, steps)
             VALUES (?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6) + INTERVAL ? SECOND, ?, ?, ?,
                     UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, ?)",
        )
        .bind(record_id(scope, key))
        .bind(scope)
        .bind(key)
        .bind(&FINGERPRINT.digest[..])
        .bind(FINGERPRINT.version)
        .bind(state)
        .bind(token.0)
        .bind(lease_secs)
        .bind(status.map(|s: i16| s))
        .bind(completed.then(|| encode_headers(&response.headers)))
        .bind(completed.then(|| response.body.as_deref().unwrap().to_vec()))
        .bind(steps)
        .execute(&mut conn)
        .await
        .unwrap();
    }

    let store = MySqlStore::connect(&database.url())
        .await
        .expect("the store opens and migrates the v3 schema");
    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _idempotent_migrations ORDER BY version")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(applied, vec![1, 2, 3, 4]);
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM idempotency_records ORDER BY `key`")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(versions, vec![0; 4], "every record kept, at version 0");
    // A record an instance of the earlier release inserts from now on (naming no
    // version) gets a random one, never a version an earlier record of its key had.
    for key in ["old-insert-1", "old-insert-2"] {
        sqlx::query(
            "INSERT INTO idempotency_records
             (scope_key_sha256, scope, `key`, fingerprint, fingerprint_version, state, token,
              lease_expires_at, created_at, expires_at)
             VALUES (?, ?, ?, ?, ?, 'in_progress', 7, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
                     UTC_TIMESTAMP(6))",
        )
        .bind(record_id(scope, key))
        .bind(scope)
        .bind(key)
        .bind(&FINGERPRINT.digest[..])
        .bind(FINGERPRINT.version)
        .execute(&mut conn)
        .await
        .unwrap();
    }
    let (first, second) = (
        version_of(&mut conn, "old-insert-1").await,
        version_of(&mut conn, "old-insert-2").await,
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
            .renew(scope, "running", running, LEASE, TTL)
            .await
            .unwrap()
    );
    assert!(
        store
            .complete(scope, "running", running, &response)
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
            .record_step(scope, "stepping", stepping, &charge)
            .await
            .unwrap()
    );
    sqlx::query(
        "UPDATE idempotency_records SET lease_expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND \
         WHERE `key` = 'stepping'",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let taker = must_resume(&store, "stepping", vec![reserve.clone(), charge.clone()]).await;
    assert!(
        !store
            .record_step(scope, "stepping", stepping, &charge)
            .await
            .unwrap(),
        "the old holder is fenced off"
    );
    assert!(
        store
            .complete(scope, "stepping", taker, &response)
            .await
            .unwrap()
    );

    // The released one resumes its step for the same request.
    let taker = must_resume(&store, "released", vec![reserve.clone()]).await;
    // An instance of the earlier release renews the new owner's claim its own way (by
    // token): the version moves, so the owner's next compare-and-set finds it stale,
    // reads the record and writes on the version it finds.
    let before = version_of(&mut conn, "released").await;
    sqlx::query(
        "UPDATE idempotency_records SET lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND \
         WHERE scope_key_sha256 = ? AND token = ? AND state = 'in_progress'",
    )
    .bind(record_id(scope, "released"))
    .bind(taker.0)
    .execute(&mut conn)
    .await
    .unwrap();
    let after = version_of(&mut conn, "released").await;
    assert_ne!(before, after, "a token-fenced write moves the version");
    assert!(
        store
            .record_step(scope, "released", taker, &charge)
            .await
            .unwrap()
    );
    // An instance of the earlier release takes the record over its own way (a new token,
    // no version named): the upgraded owner's next write is refused, where its cached
    // version would otherwise still have matched.
    let old_instance = FencingToken::random();
    sqlx::query(
        "UPDATE idempotency_records SET token = ?, lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND \
         WHERE scope_key_sha256 = ? AND state = 'in_progress'",
    )
    .bind(old_instance.0)
    .bind(record_id(scope, "released"))
    .execute(&mut conn)
    .await
    .unwrap();
    assert!(
        !store
            .complete(scope, "released", taker, &response)
            .await
            .unwrap(),
        "the earlier release's takeover fences the upgraded owner off"
    );
    let info = store.inspect(scope, "released").await.unwrap().unwrap();
    assert_eq!(
        info.steps,
        vec![reserve, charge],
        "the record as the takeover left it"
    );
    let _ = conn.close().await;
}

/// Past `max_allowed_packet` MySQL's `CONCAT` yields `NULL`, which outside strict mode is
/// stored without an error: a step that would take a record's steps past it is refused
/// with an error instead, and the steps recorded before stay.
async fn a_step_past_max_allowed_packet_is_refused_and_the_steps_kept() {
    let database = TestDatabase::new().await;
    let pool = MySqlPoolOptions::new()
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::query("SET SESSION sql_mode = 'NO_ENGINE_SUBSTITUTION'")
                    .execute(conn)
                    .await
                    .map(|_| ())
            })
        })
        .connect(&database.url())
        .await
        .unwrap();
    let store = MySqlStore::from_pool(pool).await.unwrap();
    let limit: i64 = sqlx::query_scalar("SELECT CAST(@@max_allowed_packet AS SIGNED)")
        .fetch_one(store.pool())
        .await
        .unwrap();
    let half = usize::try_from(limit / 2).unwrap();
    let token = FencingToken::random();
    store.claim(&claim_request("big", token)).await.unwrap();
    let first = step("first", &vec![b'a'; half]);
    assert!(
        store
            .record_step("acct_alice", "big", token, &first)
            .await
            .unwrap()
    );
    let error = store
        .record_step(
            "acct_alice",
            "big",
            token,
            &step("second", &vec![b'b'; half]),
        )
        .await
        .expect_err("past max_allowed_packet");
    assert!(error.to_string().contains("max_allowed_packet"), "{error}");
    let info = store.inspect("acct_alice", "big").await.unwrap().unwrap();
    assert_eq!(info.steps, vec![first], "the steps recorded before stay");
    // A token that owns nothing is told so, not the size.
    assert!(
        !store
            .record_step("acct_alice", "big", FencingToken::random(), &step("x", b""))
            .await
            .unwrap()
    );
}

/// Round trips per operation, counted as the statements the store sends (sqlx also pings
/// every connection handed back to a pool, in the background): a fresh key's claim, a
/// replay, a renewal, a step and a completion one each; a takeover two (the insert that
/// finds the record, then the compare-and-set), with its steps; a release two (the read it
/// decides on, then the delete or the compare-and-set that keeps the record), whether it
/// deletes the record or keeps it.
async fn each_operation_costs_its_round_trips() {
    let database = TestDatabase::new().await;
    let counter = CommandCounter::in_front_of(&database.url()).await;
    // One pooled connection (besides the batchers' own), so every statement below runs
    // on a connection that has prepared it already and none is opened meanwhile.
    let pool = MySqlPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect(&counter.url)
        .await
        .unwrap();
    let store = MySqlStore::from_pool(pool).await.unwrap();
    let scope = "acct_alice";
    let response = StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: Some(bytes::Bytes::from_static(b"{\"id\":1}")),
    };
    // Opens the connections and prepares every statement, so what follows counts
    // statements only.
    for key in ["warm-up-1", "warm-up-2"] {
        let warm = FencingToken::random();
        store.claim(&claim_request(key, warm)).await.unwrap();
        assert!(store.renew(scope, key, warm, LEASE, TTL).await.unwrap());
        assert!(
            store
                .record_step(scope, key, warm, &step("warm", b""))
                .await
                .unwrap()
        );
        assert!(store.release(scope, key, warm).await.unwrap());
        let again = must_resume(&store, key, vec![step("warm", b"")]).await;
        assert!(store.complete(scope, key, again, &response).await.unwrap());
        store
            .claim(&claim_request(key, FencingToken::random()))
            .await
            .unwrap();
        let plain = FencingToken::random();
        store
            .claim(&claim_request(&format!("{key}-plain"), plain))
            .await
            .unwrap();
        assert!(
            store
                .release(scope, &format!("{key}-plain"), plain)
                .await
                .unwrap()
        );
        assert_eq!(store.purge_expired(100).await.unwrap(), 0);
    }
    let mut costs = Vec::new();
    let mut counted =
        |what: &'static str, before: usize| costs.push((what, counter.statements() - before));

    let owner = FencingToken::random();
    let before = counter.statements();
    let claimed = store.claim(&claim_request("k", owner)).await.unwrap();
    assert!(matches!(
        claimed.outcome,
        ClaimOutcome::Claimed { takeover: None, .. }
    ));
    counted("fresh claim", before);

    let before = counter.statements();
    assert!(store.renew(scope, "k", owner, LEASE, TTL).await.unwrap());
    counted("renew", before);

    let charged = step("charge", b"{}");
    let before = counter.statements();
    assert!(
        store
            .record_step(scope, "k", owner, &charged)
            .await
            .unwrap()
    );
    counted("step", before);

    let before = counter.statements();
    assert!(store.release(scope, "k", owner).await.unwrap());
    counted("release keeping the record", before);
    let info = store.inspect(scope, "k").await.unwrap().unwrap();
    assert!(
        matches!(
            info.state,
            RecordState::InProgress {
                holder_alive: false,
                ..
            }
        ),
        "{info:?}"
    );
    assert!(
        !store
            .record_step(scope, "k", owner, &step("late", b""))
            .await
            .unwrap(),
        "the released token is fenced off"
    );

    let before = counter.statements();
    let resumed = must_resume(&store, "k", vec![charged]).await;
    counted("takeover", before);

    let before = counter.statements();
    assert!(
        store
            .complete(scope, "k", resumed, &response)
            .await
            .unwrap()
    );
    counted("completion", before);

    let before = counter.statements();
    let replay = store
        .claim(&claim_request("k", FencingToken::random()))
        .await
        .unwrap();
    assert_eq!(replay.outcome, ClaimOutcome::Replay(response.clone()));
    counted("replay", before);

    let fresh = FencingToken::random();
    store.claim(&claim_request("plain", fresh)).await.unwrap();
    let before = counter.statements();
    assert!(store.release(scope, "plain", fresh).await.unwrap());
    counted("release deleting the record", before);
    assert_eq!(store.inspect(scope, "plain").await.unwrap(), None);

    // The sweeper's batch: five expired records among the live ones.
    for i in 0..5 {
        let token = FencingToken::random();
        let purged = format!("purged-{i}");
        store.claim(&claim_request(&purged, token)).await.unwrap();
        assert!(
            store
                .complete(scope, &purged, token, &response)
                .await
                .unwrap()
        );
    }
    sqlx::query(
        "UPDATE idempotency_records SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND \
         WHERE `key` LIKE 'purged-%'",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let before = counter.statements();
    assert_eq!(store.purge_expired(100).await.unwrap(), 5);
    counted("purge of 5", before);

    assert_eq!(
        costs,
        vec![
            ("fresh claim", 1),
            ("renew", 1),
            ("step", 1),
            ("release keeping the record", 2),
            ("takeover", 2),
            ("completion", 1),
            ("replay", 1),
            ("release deleting the record", 2),
            ("purge of 5", 2),
        ]
    );
}

/// `record_step_in` writes on the handler's transaction: rolled back, the step is not
/// recorded; committed, it is; and it is fenced by the token inside the transaction too.
async fn a_step_recorded_in_a_transaction_commits_or_rolls_back_with_it() {
    let harness = MySqlHarness::new().await;
    let store = harness.store.clone();
    let tx_store = store
        .capabilities()
        .transactions
        .expect("transactions")
        .for_database::<sqlx::MySql>()
        .expect("on MySQL");
    let token = FencingToken::random();
    store.claim(&claim_request("tx", token)).await.unwrap();
    let charged = step("charge", br#"{"charge":"ch_1"}"#);

    let mut tx = tx_store.begin().await.unwrap();
    assert!(
        tx_store
            .record_step_in(&mut tx, "acct_alice", "tx", token, &charged)
            .await
            .unwrap()
    );
    tx.rollback().await.unwrap();
    let info = store.inspect("acct_alice", "tx").await.unwrap().unwrap();
    assert_eq!(info.steps, Vec::new(), "rolled back with the transaction");

    let mut tx = tx_store.begin().await.unwrap();
    assert!(
        tx_store
            .record_step_in(&mut tx, "acct_alice", "tx", token, &charged)
            .await
            .unwrap()
    );
    assert!(
        !tx_store
            .record_step_in(
                &mut tx,
                "acct_alice",
                "tx",
                FencingToken::random(),
                &charged
            )
            .await
            .unwrap(),
        "another token owns nothing"
    );
    tx.commit().await.unwrap();
    let info = store.inspect("acct_alice", "tx").await.unwrap().unwrap();
    assert_eq!(info.steps, vec![charged]);
}
