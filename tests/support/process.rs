//! Demo instances as real OS processes, and throwaway Postgres databases for them.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

#[cfg(feature = "postgres")]
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
        mut command: Command,
        database_url: &str,
        extra: &[&str],
    ) -> Instance {
        let port = free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let child = command
            .arg("--addr")
            .arg(addr.to_string())
            .arg("--database-url")
            .arg(database_url)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start demo process");
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

/// Whether the demo database behind `pool` holds an in-progress claim on `key`: the
/// request is past its claim and its handler is running.
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[cfg(feature = "postgres")]
#[allow(unused_imports)] // not every test file that shares this module needs it
pub(crate) use postgres::TestDatabase;

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    /// A fresh Postgres database for one test, dropped on drop; `None` (with a notice) when
    /// `IDEMPOTENT_TEST_POSTGRES_URL` is unset.
    pub(crate) struct TestDatabase {
        admin_url: String,
        pub(crate) name: String,
        pub(crate) url: String,
    }

    impl TestDatabase {
        pub(crate) async fn create(test: &str) -> Option<TestDatabase> {
            let Ok(admin_url) = std::env::var("IDEMPOTENT_TEST_POSTGRES_URL") else {
                eprintln!("skipped {test}: IDEMPOTENT_TEST_POSTGRES_URL is not set");
                return None;
            };
            let name = format!("idem_{}_{:08x}", test, rand_u32());
            let mut conn = sqlx::PgConnection::connect(&admin_url)
                .await
                .expect("connect to IDEMPOTENT_TEST_POSTGRES_URL");
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
                .execute(&mut conn)
                .await
                .expect("create database");
            let url = with_database(&admin_url, &name);
            Some(TestDatabase {
                admin_url,
                name,
                url,
            })
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
            // Drop cannot await: clean up on a thread with its own runtime, and wait for it.
            let _ = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    if let Ok(mut conn) = sqlx::PgConnection::connect(&admin_url).await {
                        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                            "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                        )))
                        .execute(&mut conn)
                        .await;
                    }
                });
            })
            .join();
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
