//! Demo instances as real OS processes, and throwaway places for them on the servers the
//! tests can use (a database on Postgres or MySQL, a key prefix on Redis).
#![allow(dead_code)] // a build without a server feature leaves some of it unused

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

#[cfg(any(feature = "postgres", feature = "mysql"))]
use sqlx::Connection;

/// A running demo process, killed (SIGKILL) on drop.
pub(crate) struct Instance {
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
}

impl Instance {
    /// Starts `binary` (`env!("CARGO_BIN_EXE_…")`) on a free port with `args`, and waits
    /// until it accepts connections.
    pub(crate) async fn start(binary: &str, database_url: &str, extra: &[&str]) -> Instance {
        Self::start_command(Command::new(binary), database_url, extra).await
    }

    /// Like [`start`](Self::start), for a prepared command (e.g. with extra environment).
    pub(crate) async fn start_command(
        command: Command,
        database_url: &str,
        extra: &[&str],
    ) -> Instance {
        Self::spawn(command, database_url, extra, None).await
    }

    /// Like [`start_command`](Self::start_command), with the process's stderr collected
    /// in the returned [`Output`] instead of shown (`RUST_LOG` as `command` sets it, else
    /// `warn`).
    pub(crate) async fn start_captured(
        command: Command,
        database_url: &str,
        extra: &[&str],
    ) -> (Instance, Output) {
        let output = Output::default();
        let instance = Self::spawn(command, database_url, extra, Some(output.clone())).await;
        (instance, output)
    }

    async fn spawn(
        mut command: Command,
        database_url: &str,
        extra: &[&str],
        capture: Option<Output>,
    ) -> Instance {
        let port = free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        if !command.get_envs().any(|(name, _)| name == "RUST_LOG") {
            command.env("RUST_LOG", "warn");
        }
        let mut child = command
            .arg("--addr")
            .arg(addr.to_string())
            .arg("--database-url")
            .arg(database_url)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(if capture.is_some() {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .spawn()
            .expect("start demo process");
        if let (Some(output), Some(stderr)) = (capture, child.stderr.take()) {
            output.collect(stderr);
        }
        let mut instance = Instance { child, addr };
        for _ in 0..300 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return instance;
            }
            if let Some(status) = instance.child.try_wait().unwrap() {
                panic!("demo exited at startup: {status}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        instance.kill();
        panic!("demo did not start listening on {addr}");
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// SIGKILL: no shutdown, no cleanup — a crash.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What a demo process wrote to stderr so far, read line by line by a thread of its own
/// (until the process exits or is killed).
#[derive(Debug, Clone, Default)]
pub(crate) struct Output {
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Output {
    fn collect(&self, stderr: std::process::ChildStderr) {
        let lines = self.lines.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                lines.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
    }

    /// The lines so far.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether a line so far contains every one of `parts`.
    pub(crate) fn has_line_with(&self, parts: &[&str]) -> bool {
        self.lines()
            .iter()
            .any(|line| parts.iter().all(|part| line.contains(part)))
    }
}

/// Alice's `POST /payments` of `body` under `key` to `url`, sent from a task of its own:
/// a request in flight while the test kills the server under it.
pub(crate) fn charge_in_flight(
    client: &reqwest::Client,
    url: String,
    key: &'static str,
    body: &'static str,
) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
    let client = client.clone();
    tokio::spawn(async move {
        client
            .post(url)
            .header("authorization", "Bearer sk_test_alice")
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
    })
}

/// Polls `condition` every 10 ms until it holds; panics, naming `what`, after 10 s.
pub(crate) async fn wait_until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..1000 {
        if condition().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

/// Whether the SQLite or Postgres database behind `pool` holds an in-progress claim on
/// `key`: the request is past its claim and its handler is running. (Any server:
/// [`TestBackend::claimed`].)
pub(crate) async fn claimed<DB>(pool: &sqlx::Pool<DB>, key: &str) -> bool
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let (count,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM idempotency_records WHERE key = $1 AND state = 'in_progress'",
    )
    .bind(key.to_owned())
    .fetch_one(pool)
    .await
    .expect("read the idempotency records");
    count == 1
}

/// A port nothing listens on, and that no other test of this binary was given: the
/// probe's listener is dropped before the demo binds, so two tests starting demos at
/// once could otherwise be handed the same port, and one would talk to the other's demo.
fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// A server the end-to-end tests can run the demos on, named by an environment variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Server {
    Postgres,
    MySql,
    Redis,
    /// A Redis Cluster (`redis+cluster://` URL), the same store type as `Redis`.
    RedisCluster,
}

impl Server {
    /// The variable holding the server's URL.
    pub(crate) fn env_var(self) -> &'static str {
        match self {
            Server::Postgres => "IDEMPOTENT_TEST_POSTGRES_URL",
            Server::MySql => "IDEMPOTENT_TEST_MYSQL_URL",
            Server::Redis => "IDEMPOTENT_TEST_REDIS_URL",
            Server::RedisCluster => "IDEMPOTENT_TEST_REDIS_CLUSTER_URL",
        }
    }

    /// A lower-case name for test names: `postgres`, `mysql`, `redis`, `redis_cluster`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Server::Postgres => "postgres",
            Server::MySql => "mysql",
            Server::Redis => "redis",
            Server::RedisCluster => "redis_cluster",
        }
    }

    /// Why tests on this server cannot run here, if they cannot: its variable is unset,
    /// or the demo was built without the store.
    pub(crate) fn unavailable(self) -> Option<String> {
        let built = match self {
            Server::Postgres => cfg!(feature = "postgres"),
            Server::MySql => cfg!(feature = "mysql"),
            Server::Redis | Server::RedisCluster => cfg!(feature = "redis"),
        };
        if !built {
            return Some(format!("built without the `{}` feature", self.name()));
        }
        match std::env::var(self.env_var()) {
            Ok(url) if !url.is_empty() => None,
            _ => Some(format!("{} is not set", self.env_var())),
        }
    }

    /// The server's URL; only called by tests that run when [`unavailable`] said nothing.
    pub(crate) fn url(self) -> String {
        match std::env::var(self.env_var()) {
            Ok(url) if !url.is_empty() => url,
            _ => panic!("{} is not set", self.env_var()),
        }
    }
}

/// A fresh place on one server for one test, removed on drop: a database of its own
/// (Postgres, MySQL) or a key prefix of its own plus an SQLite file for the gateway's
/// charges (Redis).
pub(crate) struct TestBackend {
    pub(crate) server: Server,
    /// The demo's `--database-url`.
    pub(crate) url: String,
    /// What the demo needs besides (Redis: `--gateway-database-url`).
    pub(crate) flags: Vec<String>,
    /// Where the demo keeps its own tables (the gateway's charges, the ledger).
    tables_url: String,
    cleanup: Cleanup,
}

enum Cleanup {
    /// Never built: keeps the enum inhabited when no server's feature is on.
    #[allow(dead_code)]
    Nothing(std::convert::Infallible),
    #[cfg(feature = "postgres")]
    Postgres(TestDatabase),
    #[cfg(feature = "mysql")]
    MySql { admin_url: String, name: String },
    #[cfg(feature = "redis")]
    Redis {
        server_url: String,
        prefix: String,
        _dir: tempfile::TempDir,
    },
}

impl TestBackend {
    /// A fresh database or prefix on `server` for the test `test`.
    pub(crate) async fn create(server: Server, test: &str) -> TestBackend {
        #[cfg_attr(
            not(any(feature = "mysql", feature = "redis")),
            allow(unused_variables)
        )]
        let name = format!("idem_{}_{:08x}", test, rand_u32());
        match server {
            #[cfg(feature = "postgres")]
            Server::Postgres => {
                let db = TestDatabase::create(test).await;
                TestBackend {
                    server,
                    url: db.url.clone(),
                    flags: Vec::new(),
                    tables_url: db.url.clone(),
                    cleanup: Cleanup::Postgres(db),
                }
            }
            #[cfg(feature = "mysql")]
            Server::MySql => {
                let admin_url = server.url();
                let mut conn = sqlx::MySqlConnection::connect(&admin_url)
                    .await
                    .expect("connect to IDEMPOTENT_TEST_MYSQL_URL");
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
                    .execute(&mut conn)
                    .await
                    .expect("create database");
                let url = with_database(&admin_url, &name);
                TestBackend {
                    server,
                    url: url.clone(),
                    flags: Vec::new(),
                    tables_url: url,
                    cleanup: Cleanup::MySql { admin_url, name },
                }
            }
            #[cfg(feature = "redis")]
            Server::Redis | Server::RedisCluster => {
                let server_url = server.url();
                let dir = tempfile::tempdir().expect("temp dir");
                let tables_url = format!("sqlite://{}", dir.path().join("gateway.db").display());
                let separator = if server_url.contains('?') { '&' } else { '?' };
                TestBackend {
                    server,
                    url: format!("{server_url}{separator}key_prefix={name}"),
                    flags: vec!["--gateway-database-url".to_owned(), tables_url.clone()],
                    tables_url,
                    cleanup: Cleanup::Redis {
                        server_url,
                        prefix: name,
                        _dir: dir,
                    },
                }
            }
            #[allow(unreachable_patterns)]
            _ => panic!("built without the `{}` feature", server.name()),
        }
    }

    /// The SQL database holding the demo's own tables.
    pub(crate) async fn tables(&self) -> idempotent_demo::database::Database {
        idempotent_demo::database::open_tables(&self.tables_url)
            .await
            .expect("open the demo's tables")
    }

    /// How many charge calls reached the gateway, whichever instance made them. Calls,
    /// not charges: the gateway deduplicates by downstream key, so only its call log shows
    /// a handler that ran twice.
    pub(crate) async fn gateway_calls(&self) -> i64 {
        let db = self.tables().await;
        idempotent_demo::on_pool!(&db, |pool| sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM demo_gateway_calls"
        )
        .fetch_one(pool)
        .await
        .expect("count gateway calls"))
    }

    /// Whether the store holds an in-progress claim of `acct_alice`'s `key`: the request
    /// is past its claim and its handler is running.
    pub(crate) async fn claimed(&self, key: &str) -> bool {
        match &self.cleanup {
            #[cfg(feature = "redis")]
            Cleanup::Redis {
                server_url, prefix, ..
            } => {
                let store = idempotent_runtime::store::RedisStore::builder()
                    .key_prefix(prefix.clone())
                    .connect(server_url)
                    .await
                    .expect("connect to Redis");
                let mut conn = store.connection().clone();
                let state: Option<String> = redis::cmd("HGET")
                    .arg(store.record_key("acct_alice", key))
                    .arg("state")
                    .query_async(&mut conn)
                    .await
                    .expect("read the record");
                state.as_deref() == Some("in_progress")
            }
            _ => {
                let db = self.tables().await;
                let statement = match self.server {
                    Server::MySql => {
                        "SELECT COUNT(*) FROM idempotency_records \
                         WHERE `key` = ? AND state = 'in_progress'"
                    }
                    _ => {
                        "SELECT COUNT(*) FROM idempotency_records \
                         WHERE key = $1 AND state = 'in_progress'"
                    }
                };
                let count =
                    idempotent_demo::on_pool!(&db, |pool| sqlx::query_scalar::<_, i64>(statement)
                        .bind(key.to_owned())
                        .fetch_one(pool)
                        .await
                        .expect("read the idempotency records"));
                count == 1
            }
        }
    }
}

impl Drop for TestBackend {
    fn drop(&mut self) {
        match &self.cleanup {
            Cleanup::Nothing(never) => match *never {},
            #[cfg(feature = "postgres")]
            Cleanup::Postgres(_) => {} // the TestDatabase drops itself
            #[cfg(feature = "mysql")]
            Cleanup::MySql { admin_url, name } => {
                let (admin_url, name) = (admin_url.clone(), name.clone());
                on_own_runtime(async move {
                    if let Ok(mut conn) = sqlx::MySqlConnection::connect(&admin_url).await {
                        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                            "DROP DATABASE IF EXISTS `{name}`"
                        )))
                        .execute(&mut conn)
                        .await;
                    }
                });
            }
            #[cfg(feature = "redis")]
            Cleanup::Redis {
                server_url, prefix, ..
            } => {
                let (url, pattern) = (server_url.clone(), format!("{prefix}:*"));
                on_own_runtime(async move {
                    // The store's own connection: on a cluster it sends KEYS to every
                    // primary and splits the DEL by slot.
                    let Ok(store) = idempotent_runtime::store::RedisStore::connect(&url).await
                    else {
                        return;
                    };
                    let mut conn = store.connection().clone();
                    let keys: Vec<String> = redis::cmd("KEYS")
                        .arg(&pattern)
                        .query_async(&mut conn)
                        .await
                        .unwrap_or_default();
                    if !keys.is_empty() {
                        let _: Result<i64, _> =
                            redis::cmd("DEL").arg(keys).query_async(&mut conn).await;
                    }
                });
            }
        }
    }
}

/// Runs `cleanup` to completion on a thread with its own runtime: `Drop` cannot await,
/// and the test's runtime may be shutting down.
fn on_own_runtime(cleanup: impl std::future::Future<Output = ()> + Send + 'static) {
    let _ = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(cleanup);
    })
    .join();
}

#[cfg(feature = "postgres")]
pub(crate) use postgres::TestDatabase;

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    /// A fresh Postgres database for one test, dropped on drop. Only for tests that run
    /// when `Server::Postgres.unavailable()` said nothing.
    pub(crate) struct TestDatabase {
        admin_url: String,
        pub(crate) name: String,
        pub(crate) url: String,
    }

    impl TestDatabase {
        pub(crate) async fn create(test: &str) -> TestDatabase {
            let admin_url = Server::Postgres.url();
            let name = format!("idem_{}_{:08x}", test, rand_u32());
            let mut conn = sqlx::PgConnection::connect(&admin_url)
                .await
                .expect("connect to IDEMPOTENT_TEST_POSTGRES_URL");
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
                .execute(&mut conn)
                .await
                .expect("create database");
            let url = with_database(&admin_url, &name);
            TestDatabase {
                admin_url,
                name,
                url,
            }
        }

        pub(crate) async fn pool(&self) -> sqlx::PgPool {
            sqlx::PgPool::connect(&self.url)
                .await
                .expect("connect test database")
        }
    }

    impl Drop for TestDatabase {
        fn drop(&mut self) {
            let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
            on_own_runtime(async move {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&admin_url).await {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                    )))
                    .execute(&mut conn)
                    .await;
                }
            });
        }
    }
}

/// `url` pointing at database `name` instead.
pub(crate) fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[scheme_end..].find('/') {
        Some(slash) => &base[..scheme_end + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{name}?{query}"),
        None => format!("{base}/{name}"),
    }
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    hasher.finish() as u32
}
