//! The conformance and transactional suites on [`PostgresStore`], plus what only
//! Postgres has: connection errors, concurrent migrations, the database clock, round
//! trips, recovery points under concurrency and the upgrade that adds them. Several pools
//! (instances) on one schema race in the conformance suite's `check_instances_…`.
//!
//! Needs `IDEMPOTENT_TEST_POSTGRES_URL` (e.g. `postgres://postgres@127.0.0.1:5432/test`);
//! without it every database test is reported *ignored* (the reason printed once). Each
//! test works in a fresh schema with a random name, dropped again when the test ends, so
//! tests run in parallel and leave nothing behind.
mod group_commit;
mod steps;
mod versions;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idempotent_runtime::store::PostgresStore;
use idempotent_runtime::store::{ClaimOutcome, ClaimRequest, FencingToken, RecordStore};
use idempotent_runtime::testing::conformance::{self, Harness, RecordsHarness};
use idempotent_runtime::testing::{Trial, async_trial, ignored_if};
use idempotent_runtime::{Fingerprint, Store, StoreError};
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Row};

use crate::fixtures::{LEASE, TTL, claim_request};
use crate::transaction;

const URL_VAR: &str = "IDEMPOTENT_TEST_POSTGRES_URL";

/// Test schemas are named `idem_test_<unix seconds>_<random>`.
const SCHEMA_PREFIX: &str = "idem_test_";

/// Why the database tests cannot run here, if they cannot.
fn unavailable() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => None,
        _ => Some(format!(
            "{URL_VAR} is not set (e.g. postgres://postgres@127.0.0.1:5432/test)"
        )),
    }
}

/// The database URL; only called by tests that run when [`unavailable`] said nothing.
fn database_url() -> String {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => url,
        _ => panic!("{URL_VAR} is not set"),
    }
}

/// Why the round-trip count cannot run here: it needs the database URL, naming the
/// server's host and port explicitly (it puts a counting proxy in between).
fn round_trips_unavailable() -> Option<String> {
    unavailable().or_else(|| {
        let url = database_url();
        let options: PgConnectOptions = url.parse().ok()?;
        let authority = format!("{}:{}", options.get_host(), options.get_port());
        (options.get_socket().is_some() || !url.contains(&authority))
            .then(|| format!("the round-trip count needs {URL_VAR} to name host:port explicitly"))
    })
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// A schema that exists for one test: created by the store that connects into it,
/// dropped (with everything in it) when the guard is dropped.
struct TestSchema {
    url: String,
    name: String,
}

impl TestSchema {
    /// A fresh name; nothing is created yet. Also drops schemas that crashed earlier runs
    /// left behind (older than an hour), once per test binary.
    async fn new(url: &str) -> Self {
        static SWEPT: AtomicBool = AtomicBool::new(false);
        if !SWEPT.swap(true, Ordering::SeqCst) {
            sweep_stale_schemas(url).await;
        }
        Self {
            url: url.to_owned(),
            name: format!(
                "{SCHEMA_PREFIX}{}_{:016x}",
                unix_secs(),
                rand::random::<u64>()
            ),
        }
    }

    /// The schema-qualified name of the store's table.
    fn table(&self) -> String {
        format!("\"{}\".idempotency_records", self.name)
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        // Drop cannot await, and the test's runtime may be shutting down: run the cleanup
        // on a thread of its own with its own runtime, and wait for it.
        let url = self.url.clone();
        let name = self.name.clone();
        let outcome = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let mut conn = PgConnection::connect(&url)
                    .await
                    .map_err(|e| e.to_string())?;
                sqlx::query(AssertSqlSafe(format!(
                    "DROP SCHEMA IF EXISTS \"{name}\" CASCADE"
                )))
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
            Ok(Err(e)) => eprintln!("warning: could not drop test schema {}: {e}", self.name),
            Err(_) => eprintln!("warning: cleanup of test schema {} panicked", self.name),
        }
    }
}

/// Drops `idem_test_*` schemas older than an hour (left by a crashed or killed run).
async fn sweep_stale_schemas(url: &str) {
    let Ok(mut conn) = PgConnection::connect(url).await else {
        return;
    };
    let Ok(names) = sqlx::query_scalar::<_, String>(
        "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'idem\\_test\\_%'",
    )
    .fetch_all(&mut conn)
    .await
    else {
        return;
    };
    let cutoff = unix_secs().saturating_sub(3600);
    for name in names {
        let created = name
            .strip_prefix(SCHEMA_PREFIX)
            .and_then(|rest| rest.split('_').next())
            .and_then(|secs| secs.parse::<u64>().ok());
        if created.is_some_and(|secs| secs < cutoff) {
            let _ = sqlx::query(AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS \"{name}\" CASCADE"
            )))
            .execute(&mut conn)
            .await;
        }
    }
    let _ = conn.close().await;
}

fn interval(d: Duration) -> PgInterval {
    PgInterval {
        months: 0,
        days: 0,
        microseconds: i64::try_from(d.as_micros()).expect("test durations fit"),
    }
}

/// A fresh [`PostgresStore`] in its own schema. Its pool's connections also have that
/// schema as their `search_path`, so the tables a test creates unqualified (the
/// transactional suite's ledger) are the test's own too. Time moves by shifting the stored
/// timestamps back, which to the store (deciding by the database's `now()`) is the same
/// as the database clock moving forward.
struct PostgresHarness {
    store: Arc<PostgresStore>,
    schema: TestSchema,
}

#[async_trait::async_trait]
impl Harness for PostgresHarness {
    fn unavailable() -> Option<String> {
        unavailable()
    }

    async fn new() -> Self {
        let schema = TestSchema::new(&database_url()).await;
        Self {
            store: Arc::new(PostgresHarness::open(&schema).await),
            schema,
        }
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn advance(&self, d: Duration) {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET expires_at = expires_at - $1, \
             lease_expires_at = lease_expires_at - $1, created_at = created_at - $1",
            self.schema.table()
        )))
        .bind(interval(d))
        .execute(self.store.pool())
        .await
        .expect("shift timestamps");
    }

    async fn another_store(&self) -> Option<Arc<dyn Store>> {
        Some(Arc::new(PostgresHarness::open(&self.schema).await))
    }
}

impl PostgresHarness {
    /// A store in `schema` on a pool of its own, whose connections also have that schema
    /// as their `search_path`.
    async fn open(schema: &TestSchema) -> PostgresStore {
        let options: PgConnectOptions = schema
            .url
            .parse()
            .unwrap_or_else(|e| panic!("{URL_VAR} is not a Postgres URL: {e}"));
        // Configured like `PostgresStore::connect`'s own pool.
        let pool = PgPoolOptions::new()
            .test_before_acquire(false)
            .connect_with(options.options([("search_path", schema.name.as_str())]))
            .await
            .unwrap_or_else(|e| panic!("{URL_VAR} is set but unreachable: {e}"));
        PostgresStore::from_pool_in_schema(pool, &schema.name)
            .await
            .unwrap_or_else(|e| panic!("{URL_VAR} is set but the store cannot open: {e}"))
    }
}

impl RecordsHarness for PostgresHarness {
    fn records(&self) -> &dyn RecordStore {
        self.store.records()
    }
}

pub(crate) fn trials() -> Vec<Trial> {
    let mut trials = conformance::trials::<PostgresHarness>();
    trials.extend(conformance::record_trials::<PostgresHarness>());
    trials.extend(transaction::trials::<PostgresHarness, sqlx::Postgres>());
    // Without a database.
    trials.push(async_trial(
        "unreachable_server_is_an_open_error_naming_the_redacted_url",
        unreachable_server_is_an_open_error_naming_the_redacted_url,
    ));
    trials.push(async_trial(
        "invalid_schema_name_is_refused_before_connecting",
        invalid_schema_name_is_refused_before_connecting,
    ));
    let with_database: Vec<Trial> = vec![
        async_trial(
            "concurrent_starts_migrate_one_fresh_schema_once",
            concurrent_starts_migrate_one_fresh_schema_once,
        ),
        async_trial(
            "a_fresh_and_a_restarted_open_log_no_notices",
            a_fresh_and_a_restarted_open_log_no_notices,
        ),
        async_trial(
            "timestamps_come_from_the_database_clock",
            timestamps_come_from_the_database_clock,
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
            "connect_honours_a_search_path_in_the_url",
            connect_honours_a_search_path_in_the_url,
        ),
        async_trial(
            "test_schemas_are_dropped_when_the_harness_is",
            test_schemas_are_dropped_when_the_harness_is,
        ),
        async_trial(
            "debug_names_the_location_without_a_password",
            debug_names_the_location_without_a_password,
        ),
    ];
    trials.extend(ignored_if(unavailable(), with_database));
    trials.extend(ignored_if(unavailable(), steps::trials()));
    trials.extend(ignored_if(unavailable(), versions::trials()));
    trials.extend(ignored_if(
        round_trips_unavailable(),
        [
            async_trial(
                "a_fresh_request_costs_two_round_trips_and_a_replay_one",
                a_fresh_request_costs_two_round_trips_and_a_replay_one,
            ),
            async_trial(
                "each_operation_costs_its_round_trips",
                each_operation_costs_its_round_trips,
            ),
        ]
        .into_iter()
        .chain(group_commit::trials())
        .collect(),
    ));
    trials
}

async fn unreachable_server_is_an_open_error_naming_the_redacted_url() {
    // Needs no database: nothing listens on port 1.
    let url = "postgres://idem_user:hunter2@127.0.0.1:1/payments";
    let error = PostgresStore::connect(url)
        .await
        .expect_err("nothing listens on port 1");
    let message = error.to_string();
    match &error {
        StoreError::Open { location, reason } => {
            assert_eq!(location, "postgres://idem_user:***@127.0.0.1:1/payments");
            assert!(!reason.is_empty());
        }
        other => panic!("expected StoreError::Open, got {other:?}"),
    }
    assert!(
        message.contains("postgres://idem_user:***@127.0.0.1:1/payments"),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
    assert!(!format!("{error:?}").contains("hunter2"));

    // The same through a schema, and for a password given as a query parameter.
    let error = PostgresStore::connect_in_schema(
        "postgres://idem_user@127.0.0.1:1/payments?password=hunter2",
        "idem",
    )
    .await
    .expect_err("nothing listens on port 1");
    let message = error.to_string();
    assert!(
        message.contains("postgres://idem_user@127.0.0.1:1/payments?password=***"),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
}

async fn invalid_schema_name_is_refused_before_connecting() {
    let error = PostgresStore::connect_in_schema("postgres://u:pw@127.0.0.1:1/db", "x\"; DROP")
        .await
        .expect_err("invalid schema name");
    match error {
        StoreError::Open { location, reason } => {
            assert_eq!(location, "postgres://u:***@127.0.0.1:1/db");
            assert!(reason.contains("invalid schema name"), "{reason}");
        }
        other => panic!("expected StoreError::Open, got {other:?}"),
    }
}

/// The Postgres notices sqlx logs (target `sqlx::postgres::notice`, `INFO` for a
/// `NOTICE`) while a future runs with this layer's subscriber.
#[derive(Clone, Default)]
struct Notices(Arc<std::sync::Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Notices {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() == "sqlx::postgres::notice" {
            let mut message = Message(String::new());
            event.record(&mut message);
            self.0.lock().unwrap().push(message.0);
        }
    }
}

/// An event's `message` field.
struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

/// A first start looks like a clean start: no `… does not exist, skipping` from the
/// migrations' `DROP … IF EXISTS`, and no `… already exists, skipping` on every restart.
/// Operators read such lines as errors.
async fn a_fresh_and_a_restarted_open_log_no_notices() {
    use tracing::instrument::WithSubscriber;
    use tracing_subscriber::layer::SubscriberExt;

    let url = database_url();
    let schema = TestSchema::new(&url).await;
    for start in ["fresh", "restarted"] {
        let notices = Notices::default();
        let subscriber = tracing_subscriber::registry().with(notices.clone());
        let store = PostgresStore::connect_in_schema(&url, &schema.name)
            .with_subscriber(subscriber)
            .await
            .unwrap_or_else(|e| panic!("{start} open: {e}"));
        store.pool().close().await;
        let logged = notices.0.lock().unwrap().clone();
        assert!(
            logged.is_empty(),
            "a {start} open logged notices: {logged:?}"
        );
    }
}

async fn concurrent_starts_migrate_one_fresh_schema_once() {
    let url = database_url();
    let schema = TestSchema::new(&url).await;
    let starts = (0..4).map(|_| PostgresStore::connect_in_schema(&url, &schema.name));
    let stores: Vec<PostgresStore> = futures_util::future::join_all(starts)
        .await
        .into_iter()
        .map(|started| started.expect("every concurrent start succeeds"))
        .collect();

    let applied: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT version FROM \"{}\"._idempotent_migrations ORDER BY version",
        schema.name
    )))
    .fetch_all(stores[0].pool())
    .await
    .expect("migrations table");
    assert_eq!(
        applied,
        vec![1, 2, 3, 4, 5],
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
    let url = database_url();
    let schema = TestSchema::new(&url).await;
    let store = PostgresStore::connect_in_schema(&url, &schema.name)
        .await
        .unwrap();
    let token = FencingToken::random();
    store.claim(&claim_request("clock", token)).await.unwrap();
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT extract(epoch FROM expires_at - created_at)::float8 AS ttl,
                extract(epoch FROM lease_expires_at - created_at)::float8 AS lease,
                abs(extract(epoch FROM now() - created_at))::float8 AS age,
                state, token
         FROM {} WHERE scope = 'acct_alice' AND key = 'clock'",
        schema.table()
    )))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(row.get::<f64, _>("ttl"), TTL.as_secs_f64());
    assert_eq!(row.get::<f64, _>("lease"), LEASE.as_secs_f64());
    assert!(
        row.get::<f64, _>("age") < 5.0,
        "created_at is the database's now()"
    );
    assert_eq!(row.get::<String, _>("state"), "in_progress");
    assert_eq!(row.get::<i64, _>("token"), token.0);

    // A renew moves the lease from the database's now(), exactly.
    store
        .renew(
            "acct_alice",
            "clock",
            token,
            Duration::from_millis(1500),
            TTL,
        )
        .await
        .unwrap();
    let remaining: f64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT extract(epoch FROM lease_expires_at - now())::float8 FROM {} \
         WHERE scope = 'acct_alice' AND key = 'clock'",
        schema.table()
    )))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert!(remaining > 0.5 && remaining <= 1.5, "{remaining}");
}

async fn replays_duplicates_and_mismatches_write_nothing() {
    let url = database_url();
    let schema = TestSchema::new(&url).await;
    let store = PostgresStore::connect_in_schema(&url, &schema.name)
        .await
        .unwrap();
    // The row version (xmin) and lock marker (xmax): a refused upsert would still lock
    // the row, setting xmax, in a write transaction of its own.
    let row_version = |key: &'static str| {
        let pool = store.pool().clone();
        let table = schema.table();
        async move {
            sqlx::query_as::<_, (String, String)>(AssertSqlSafe(format!(
                "SELECT xmin::text, xmax::text FROM {table} \
                 WHERE scope = 'acct_alice' AND key = $1"
            )))
            .bind(key)
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
    let before = row_version("running").await;
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
    assert_eq!(row_version("running").await, before, "in progress");

    assert!(
        store
            .complete(
                "acct_alice",
                "running",
                token,
                &idempotent_runtime::store::StoredResponse {
                    status: 201,
                    headers: Vec::new(),
                    body: None,
                },
            )
            .await
            .unwrap()
    );
    let before = row_version("running").await;
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
    assert_eq!(row_version("running").await, before, "completed");
}

async fn shares_a_pool_and_uses_its_own_migrations_table() {
    let url = database_url();
    let schema = TestSchema::new(&url).await;
    // An app's pool whose search_path points at the (pre-existing) schema: the store's
    // table lands there, unqualified, and the app's own sqlx bookkeeping is untouched.
    let mut admin = PgConnection::connect(&url).await.unwrap();
    sqlx::query(AssertSqlSafe(format!("CREATE SCHEMA \"{}\"", schema.name)))
        .execute(&mut admin)
        .await
        .unwrap();
    let options: PgConnectOptions = url.parse().unwrap();
    let app_pool = PgPoolOptions::new()
        .max_connections(3)
        .connect_with(options.options([("search_path", schema.name.as_str())]))
        .await
        .unwrap();
    let store = PostgresStore::from_pool(app_pool.clone()).await.unwrap();
    assert!(store.schema().is_none());
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
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables \
         WHERE table_schema = $1 ORDER BY table_name",
    )
    .bind(&schema.name)
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert_eq!(tables, ["_idempotent_migrations", "idempotency_records"]);

    // The app's pool is still usable, its search_path unchanged.
    let path: String = sqlx::query_scalar("SHOW search_path")
        .fetch_one(&app_pool)
        .await
        .unwrap();
    assert_eq!(path, schema.name);

    // A second store in another schema on the same pool qualifies its table and leaves
    // the pool's search_path alone.
    let other = format!("{}_b", schema.name);
    let _other_guard = TestSchema {
        url: url.clone(),
        name: other.clone(),
    };
    let qualified = PostgresStore::from_pool_in_schema(app_pool.clone(), &other)
        .await
        .unwrap();
    assert_eq!(qualified.schema(), Some(other.as_str()));
    let token = FencingToken::random();
    assert_eq!(
        qualified
            .claim(&claim_request("shared", token))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::Claimed {
            token,
            takeover: None,
            steps: Vec::new(),
        },
        "a separate table: the claim in the first schema does not collide"
    );
    let path: String = sqlx::query_scalar("SHOW search_path")
        .fetch_one(&app_pool)
        .await
        .unwrap();
    assert_eq!(path, schema.name);
    let _ = admin.close().await;
}

async fn connect_honours_a_search_path_in_the_url() {
    let url = database_url();
    let schema = TestSchema::new(&url).await;
    let mut admin = PgConnection::connect(&url).await.unwrap();
    sqlx::query(AssertSqlSafe(format!("CREATE SCHEMA \"{}\"", schema.name)))
        .execute(&mut admin)
        .await
        .unwrap();
    let separator = if url.contains('?') { '&' } else { '?' };
    let with_path = format!("{url}{separator}options[search_path]={}", schema.name);
    let store = PostgresStore::connect(&with_path).await.unwrap();
    let token = FencingToken::random();
    store.claim(&claim_request("k", token)).await.unwrap();
    let count: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {}",
        schema.table()
    )))
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(count, 1);
    let _ = admin.close().await;
}

async fn test_schemas_are_dropped_when_the_harness_is() {
    let url = database_url();
    let harness = PostgresHarness::new().await;
    let name = harness.schema.name.clone();
    let exists = |url: String, name: String| async move {
        let mut conn = PgConnection::connect(&url).await.unwrap();
        let found: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                .bind(name)
                .fetch_one(&mut conn)
                .await
                .unwrap();
        let _ = conn.close().await;
        found
    };
    assert!(exists(url.clone(), name.clone()).await);
    drop(harness);
    assert!(!exists(url, name).await, "the schema was dropped");
}

async fn debug_names_the_location_without_a_password() {
    let url = database_url();
    let schema = TestSchema::new(&url).await;
    let store = PostgresStore::connect_in_schema(&url, &schema.name)
        .await
        .unwrap();
    let options: PgConnectOptions = url.parse().unwrap();
    let debug = format!("{store:?}");
    assert!(debug.contains(&schema.name), "{debug}");
    assert!(debug.contains(options.get_host()), "{debug}");
    assert!(!debug.contains("password"), "{debug}");
}

/// Counts request/response turns between sqlx and the server, per connection: a turn
/// begins each time the client sends after the server last spoke. Classified by the first
/// message the client sends: `B` (Bind) executes a prepared statement, `P` (Parse)
/// prepares one (once per statement and connection), a lone `Sync` is sqlx's pool
/// pinging a connection (sqlx 0.9 does on every release, in a background task, after the
/// caller has its result); anything else is connection start-up. (While a released
/// connection is being pinged, the pool may open another one for the next operation, so
/// only executions are counted exactly.)
#[derive(Default)]
struct TurnCounter {
    executions: std::sync::atomic::AtomicU64,
    prepares: std::sync::atomic::AtomicU64,
    pings: std::sync::atomic::AtomicU64,
    other: std::sync::atomic::AtomicU64,
}

/// The Postgres wire message `Sync`: type `S`, length 4.
const SYNC: &[u8] = b"S\0\0\0\x04";

/// A TCP proxy in front of the server that counts turns; returns its port.
async fn counting_proxy(target: (String, u16), counter: Arc<TurnCounter>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::TcpStream::connect((target.0.as_str(), target.1))
                .await
                .unwrap();
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            let server_spoke_last = Arc::new(AtomicBool::new(true));
            let (up, spoke) = (counter.clone(), server_spoke_last.clone());
            tokio::spawn(async move {
                let mut buf = vec![0; 64 * 1024];
                while let Ok(n @ 1..) = client_read.read(&mut buf).await {
                    if spoke.swap(false, Ordering::SeqCst) {
                        let kind = match &buf[..n] {
                            SYNC => &up.pings,
                            [b'B', ..] => &up.executions,
                            [b'P', ..] => &up.prepares,
                            _ => &up.other,
                        };
                        kind.fetch_add(1, Ordering::SeqCst);
                    }
                    if server_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
            tokio::spawn(async move {
                let mut buf = vec![0; 64 * 1024];
                while let Ok(n @ 1..) = server_read.read(&mut buf).await {
                    server_spoke_last.store(true, Ordering::SeqCst);
                    if client_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// A store connected (with `connect_in_schema`) through a [`counting_proxy`], and the
/// proxy's counter.
async fn store_behind_counting_proxy(schema: &TestSchema) -> (PostgresStore, Arc<TurnCounter>) {
    let url = database_url();
    let options: PgConnectOptions = url.parse().unwrap();
    let authority = format!("{}:{}", options.get_host(), options.get_port());
    let counter = Arc::new(TurnCounter::default());
    let target = (options.get_host().to_owned(), options.get_port());
    let port = counting_proxy(target, counter.clone()).await;
    let store = PostgresStore::connect_in_schema(
        &url.replacen(&authority, &format!("127.0.0.1:{port}"), 1),
        &schema.name,
    )
    .await
    .unwrap();
    (store, counter)
}

async fn a_fresh_request_costs_two_round_trips_and_a_replay_one() {
    let schema = TestSchema::new(&database_url()).await;
    // `connect` itself, through the proxy: its pool configuration is part of the cost.
    let (store, counter) = store_behind_counting_proxy(&schema).await;
    let stored = idempotent_runtime::store::StoredResponse {
        status: 201,
        headers: vec![("content-type".to_owned(), b"application/json".to_vec())],
        body: Some(bytes::Bytes::from_static(b"{}")),
    };
    let fresh = |key: &'static str| {
        let store = store.clone();
        let stored = stored.clone();
        async move {
            let token = FencingToken::random();
            let outcome = store
                .claim(&claim_request(key, token))
                .await
                .unwrap()
                .outcome;
            assert_eq!(
                outcome,
                ClaimOutcome::Claimed {
                    token,
                    takeover: None,
                    steps: Vec::new(),
                }
            );
            assert!(
                store
                    .complete("acct_alice", key, token, &stored)
                    .await
                    .unwrap()
            );
        }
    };
    let replay = |key: &'static str| {
        let store = store.clone();
        async move {
            let outcome = store
                .claim(&claim_request(key, FencingToken::random()))
                .await
                .unwrap()
                .outcome;
            assert!(matches!(outcome, ClaimOutcome::Replay(_)), "{outcome:?}");
        }
    };
    // Let the pool's background release ping finish before counting on: a connection is
    // idle again once its ping is done.
    let settle = || async {
        for _ in 0..1000 {
            if store.pool().num_idle() == store.pool().size() as usize {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("the pool's connections never became idle");
    };
    // Warm up: the first use of each statement on a connection also prepares it.
    fresh("warm").await;
    replay("warm").await;
    settle().await;

    // No ping before each use (sqlx's default), which would add a round trip in front of
    // every statement.
    assert!(!store.pool().options().get_test_before_acquire());
    let executions = || counter.executions.load(Ordering::SeqCst);
    for key in ["a", "b", "c"] {
        let before = executions();
        fresh(key).await;
        assert_eq!(executions() - before, 2, "claim + complete of a fresh key");
        settle().await;
        let before = executions();
        replay(key).await;
        assert_eq!(executions() - before, 1, "a replay");
        settle().await;
    }
    // Claims and completions run on the store's own connections, which sqlx's pool
    // does not ping when they are given back.
    assert_eq!(
        counter.pings.load(Ordering::SeqCst),
        0,
        "no ping on the wire"
    );
}

/// The round trips of each operation of the protocol, counted as statements executed at
/// the proxy, each after a warm-up of the same operation (statements are prepared once
/// per connection): a fresh claim, a replay, a renewal, a step and a completion one each;
/// a takeover (rare) at most two.
async fn each_operation_costs_its_round_trips() {
    let schema = TestSchema::new(&database_url()).await;
    let (store, counter) = store_behind_counting_proxy(&schema).await;
    let executions = || counter.executions.load(Ordering::SeqCst);
    let step = idempotent_runtime::store::RecordedStep {
        name: "charge".to_owned(),
        output: bytes::Bytes::from_static(b"ch_1"),
        recorded_at: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
    };
    let stored = crate::fixtures::stored(b"{}");
    let mut counted = Vec::new();
    for round in ["warm-up", "counted"] {
        let key = |name: &str| format!("{round}-{name}");
        let mut costs = Vec::new();
        let mut cost = |name: &'static str, before: u64| costs.push((name, executions() - before));

        let token = FencingToken::random();
        let before = executions();
        let outcome = store.claim(&claim_request(&key("a"), token)).await.unwrap();
        cost("fresh claim", before);
        assert!(matches!(
            outcome.outcome,
            ClaimOutcome::Claimed { takeover: None, .. }
        ));

        let before = executions();
        assert!(
            store
                .renew("acct_alice", &key("a"), token, LEASE, TTL)
                .await
                .unwrap()
        );
        cost("renew", before);

        let before = executions();
        assert!(
            store
                .record_step("acct_alice", &key("a"), token, &step)
                .await
                .unwrap()
        );
        cost("step", before);

        let before = executions();
        assert!(
            store
                .complete("acct_alice", &key("a"), token, &stored)
                .await
                .unwrap()
        );
        cost("complete", before);

        let before = executions();
        let outcome = store
            .claim(&claim_request(&key("a"), FencingToken::random()))
            .await
            .unwrap();
        cost("replay", before);
        assert!(
            matches!(outcome.outcome, ClaimOutcome::Replay(_)),
            "{outcome:?}"
        );

        // A claim whose holder recorded a step and stopped renewing.
        let holder = FencingToken::random();
        store
            .claim(&claim_request(&key("b"), holder))
            .await
            .unwrap();
        assert!(
            store
                .record_step("acct_alice", &key("b"), holder, &step)
                .await
                .unwrap()
        );
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET lease_expires_at = now() - interval '1 second' WHERE key = $1",
            schema.table()
        )))
        .bind(key("b"))
        .execute(store.pool())
        .await
        .unwrap();
        let taker = FencingToken::random();
        let before = executions();
        let outcome = store.claim(&claim_request(&key("b"), taker)).await.unwrap();
        cost("takeover", before);
        assert_eq!(
            outcome.outcome,
            ClaimOutcome::Claimed {
                token: taker,
                takeover: Some(idempotent_runtime::store::Takeover::LeaseLost),
                steps: vec![step.clone()],
            }
        );

        let before = executions();
        assert!(store.release("acct_alice", &key("b"), taker).await.unwrap());
        cost("release (keeping steps)", before);

        // The sweeper's batch: five expired records among the live ones.
        for i in 0..5 {
            let token = FencingToken::random();
            let purged = key(&format!("purged-{i}"));
            store.claim(&claim_request(&purged, token)).await.unwrap();
            assert!(
                store
                    .complete("acct_alice", &purged, token, &stored)
                    .await
                    .unwrap()
            );
        }
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET expires_at = now() - interval '1 second' WHERE key LIKE $1",
            schema.table()
        )))
        .bind(key("purged-%"))
        .execute(store.pool())
        .await
        .unwrap();
        let before = executions();
        assert_eq!(store.purge_expired(100).await.unwrap(), 5);
        cost("purge of 5", before);
        counted = costs;
    }
    eprintln!("round trips per operation: {counted:?}");
    for (operation, most) in [
        ("fresh claim", 1),
        ("renew", 1),
        ("step", 1),
        ("complete", 1),
        ("replay", 1),
        ("takeover", 2),
        ("release (keeping steps)", 2),
        ("purge of 5", 2),
    ] {
        let (_, cost) = counted.iter().find(|(name, _)| *name == operation).unwrap();
        assert!(
            *cost <= most,
            "{operation}: {cost} round trips, at most {most}"
        );
        assert!(*cost >= 1, "{operation}: counted nothing");
    }
    let (_, purge) = counted
        .iter()
        .find(|(name, _)| *name == "purge of 5")
        .unwrap();
    assert_eq!(*purge, 2, "the candidates, then one delete of all five");
}
