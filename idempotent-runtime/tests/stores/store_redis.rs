//! The conformance suite on [`RedisStore`], plus what only Redis has: the key layout and
//! record encoding, redacted connection errors, Redis's own expiry (PTTL), script
//! reloading, round trips per operation, steps in the record's hash, and the record
//! register itself (`upgrade`: each change as the seam defines it, records of
//! the previous release without a version).
//!
//! Needs `IDEMPOTENT_TEST_REDIS_URL` (e.g. `redis://127.0.0.1:6379/`); without it every
//! server test is reported as ignored, with the reason printed once. Each test works under a
//! key prefix of its own (`idem-test:<unix seconds>:<random>`) whose keys are deleted when
//! the test ends, so tests run in parallel and leave nothing behind (and every record
//! carries a Redis expiry, so even a killed run's keys go away on their own).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use idempotent_runtime::store::RecordStore;
use idempotent_runtime::store::{
    ClaimOutcome, ClaimRequest, FencingToken, StoredResponse, Takeover,
};
use idempotent_runtime::store::{Record, RecordedStep, RedisConnection, RedisStore, encode_step};
use idempotent_runtime::testing::conformance::{self, Harness, RecordsHarness};
use idempotent_runtime::testing::{Trial, async_trial, ignored_if};
use idempotent_runtime::{Fingerprint, RecordState, Store, StoreError};
use redis::AsyncCommands;

use crate::fixtures::{LEASE, TTL, claim_request, must_resume, stored};

mod upgrade;

const URL_VAR: &str = "IDEMPOTENT_TEST_REDIS_URL";

/// Why the server tests cannot run here, if they cannot.
fn unavailable() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => None,
        _ => Some(format!(
            "{URL_VAR} is not set (e.g. redis://127.0.0.1:6379/)"
        )),
    }
}

/// The server URL; only called by tests that run when [`unavailable`] said nothing.
fn redis_url() -> String {
    std::env::var(URL_VAR).unwrap_or_else(|_| panic!("{URL_VAR} is not set"))
}

/// A key prefix that exists for one test: its keys are deleted when the guard is dropped.
struct TestPrefix {
    url: String,
    prefix: String,
}

impl TestPrefix {
    fn new(url: &str) -> Self {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        Self {
            url: url.to_owned(),
            prefix: format!("idem-test:{secs}:{:016x}", rand::random::<u64>()),
        }
    }

    async fn store(&self) -> RedisStore {
        RedisStore::builder()
            .key_prefix(&self.prefix)
            .connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("{URL_VAR} is set but the store cannot open: {e}"))
    }
}

/// Every key under `prefix` (a synchronous connection: usable from `Drop`).
fn keys_under(url: &str, prefix: &str) -> redis::RedisResult<Vec<String>> {
    let mut conn = redis::Client::open(url)?.get_connection()?;
    let mut keys = Vec::new();
    let mut cursor = 0_u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query(&mut conn)?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

impl Drop for TestPrefix {
    fn drop(&mut self) {
        let cleanup = || -> redis::RedisResult<()> {
            let keys = keys_under(&self.url, &self.prefix)?;
            if !keys.is_empty() {
                let mut conn = redis::Client::open(self.url.as_str())?.get_connection()?;
                redis::cmd("DEL").arg(&keys).exec(&mut conn)?;
            }
            Ok(())
        };
        // Never panic in Drop (the test may already be unwinding); say it loudly.
        if let Err(e) = cleanup() {
            eprintln!("warning: could not delete test keys {}:*: {e}", self.prefix);
        }
    }
}

/// Moves time for every record under `prefix`: its times are shifted back by `by`, each
/// record's in one script, as the Postgres harness shifts its rows (the store's scripts
/// read the server's `TIME`, which no test moves). Redis's own expiry keeps real time, so
/// a record expired this way stays until a purge or that expiry deletes it.
pub(crate) async fn shift_back(conn: &RedisConnection, prefix: &str, by: Duration) {
    static SHIFT: LazyLock<redis::Script> = LazyLock::new(|| {
        redis::Script::new(
            r"
            if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then
              return 0
            end
            for _, field in ipairs({ 'expires_at', 'lease_expires_at', 'created_at' }) do
              if redis.call('HEXISTS', KEYS[1], field) == 1 then
                redis.call('HINCRBY', KEYS[1], field, -tonumber(ARGV[1]))
              end
            end
            return 1",
        )
    });
    let by = i64::try_from(by.as_millis()).expect("a shift in range");
    let mut conn = conn.clone();
    // On a cluster, the client asks every primary and joins the answers.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut conn)
        .await
        .expect("list the test's keys");
    for key in keys {
        // A record whose times are not numbers (a corrupt one a test wrote) stays as it is.
        let _: redis::RedisResult<i64> = SHIFT.key(&key).arg(by).invoke_async(&mut conn).await;
    }
}

/// A fresh [`RedisStore`] under its own prefix. Time moves by [`shift_back`].
struct RedisHarness {
    store: Arc<RedisStore>,
    prefix: TestPrefix,
}

#[async_trait::async_trait]
impl Harness for RedisHarness {
    fn unavailable() -> Option<String> {
        unavailable()
    }

    async fn new() -> Self {
        let prefix = TestPrefix::new(&redis_url());
        Self {
            store: Arc::new(prefix.store().await),
            prefix,
        }
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn advance(&self, d: Duration) {
        shift_back(self.store.connection(), &self.prefix.prefix, d).await;
    }

    async fn another_store(&self) -> Option<Arc<dyn Store>> {
        Some(Arc::new(self.prefix.store().await))
    }
}

impl RecordsHarness for RedisHarness {
    fn records(&self) -> &dyn RecordStore {
        self.store.records()
    }
}

pub(crate) async fn must_claim(store: &RedisStore, request: &ClaimRequest<'_>) {
    assert_eq!(
        store.claim(request).await.expect("claim").outcome,
        ClaimOutcome::Claimed {
            token: request.token,
            takeover: None,
            steps: Vec::new(),
        }
    );
}

/// A step named `name` whose output is `output`, recorded at a fixed time.
pub(crate) fn step(name: &str, output: &str) -> RecordedStep {
    RecordedStep {
        name: name.to_owned(),
        output: Bytes::copy_from_slice(output.as_bytes()),
        recorded_at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
    }
}

/// The server's clock in milliseconds since the Unix epoch (what the scripts read).
async fn server_now_ms(conn: &mut (impl redis::aio::ConnectionLike + Send)) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    secs * 1000 + micros / 1000
}

async fn unreachable_server_is_an_open_error_naming_the_redacted_url() {
    // Needs no server: nothing listens on port 1.
    let url = "redis://idem_user:hunter2@127.0.0.1:1/0";
    let error = RedisStore::connect(url)
        .await
        .expect_err("nothing listens on port 1");
    match &error {
        StoreError::Open { location, reason } => {
            assert_eq!(location, "redis://idem_user:***@127.0.0.1:1/0");
            assert!(!reason.is_empty());
        }
        other => panic!("expected StoreError::Open, got {other:?}"),
    }
    let message = error.to_string();
    assert!(
        message.contains("redis://idem_user:***@127.0.0.1:1/0"),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
    assert!(!format!("{error:?}").contains("hunter2"));

    // A password-only URL, and a URL the client refuses before connecting.
    let error = RedisStore::connect("redis://:hunter2@127.0.0.1:1")
        .await
        .expect_err("nothing listens on port 1");
    assert!(
        error.to_string().contains("redis://:***@127.0.0.1:1"),
        "{error}"
    );
    let error = RedisStore::connect("redis://u:hunter2@127.0.0.1:notaport/")
        .await
        .expect_err("an invalid port");
    assert!(matches!(error, StoreError::Open { .. }), "{error:?}");
    assert!(
        !format!("{error} {error:?}").contains("hunter2"),
        "{error:?}"
    );
}

async fn prefixes_with_braces_are_refused_before_connecting() {
    let error = RedisStore::builder()
        .key_prefix("tenant{1}")
        .connect("redis://u:pw@127.0.0.1:1/")
        .await
        .expect_err("a prefix with braces");
    match error {
        StoreError::Open { location, reason } => {
            assert_eq!(location, "redis://u:***@127.0.0.1:1/");
            assert!(reason.contains("invalid key prefix"), "{reason}");
        }
        other => panic!("expected StoreError::Open, got {other:?}"),
    }
}

async fn a_wrong_password_is_refused_without_echoing_it() {
    let url = redis_url();
    let parsed = url::Url::parse(&url).expect("a URL");
    if parsed.password().is_some() {
        eprintln!("skipped: the test server's URL already carries a password");
        return;
    }
    let mut wrong = parsed.clone();
    wrong.set_username("idem_nobody").expect("a user");
    wrong
        .set_password(Some("hunter2-wrong"))
        .expect("a password");
    let error = RedisStore::connect(wrong.as_str())
        .await
        .expect_err("an unknown user and password");
    let text = format!("{error} {error:?}");
    assert!(matches!(error, StoreError::Open { .. }), "{text}");
    assert!(text.contains("idem_nobody:***@"), "{text}");
    assert!(!text.contains("hunter2-wrong"), "{text}");
}

async fn records_are_one_hash_under_the_prefix_with_a_hash_tag_over_scope_and_key() {
    let url = redis_url();
    let prefix = TestPrefix::new(&url);
    let store = prefix.store().await;
    assert_eq!(store.key_prefix(), prefix.prefix);
    let key = store.record_key("acct_alice", "k-1");
    assert_eq!(key, format!("{}:{{10:acct_alice:k-1}}", prefix.prefix));
    assert_eq!(
        store.record_key("a:b", "c"),
        format!("{}:{{3:a:b:c}}", prefix.prefix)
    );
    assert_eq!(
        store.record_key("a", "b:c"),
        format!("{}:{{1:a:b:c}}", prefix.prefix)
    );
    // A brace in a client's key is encoded, so the hash tag still covers all of it.
    assert_eq!(
        store.record_key("s", "x}y{"),
        format!("{}:{{1:s:x%7Dy%7B}}", prefix.prefix)
    );

    let token = FencingToken::random();
    must_claim(&store, &claim_request("k-1", token)).await;
    assert_eq!(
        keys_under(&url, &prefix.prefix).unwrap(),
        std::slice::from_ref(&key),
        "one key per record, nothing else"
    );
    let mut conn = store.connection().clone();
    let kind: String = redis::cmd("TYPE")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, "hash");
    let fields: std::collections::HashMap<String, Vec<u8>> = conn.hgetall(&key).await.unwrap();
    let mut names: Vec<&str> = fields.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "created_at",
            "expires_at",
            "fp",
            "fpv",
            "lease_expires_at",
            "state",
            "token",
            "version"
        ]
    );
    assert_eq!(
        fields["version"],
        Record::first_version(token).to_string().as_bytes()
    );
    assert_eq!(fields["state"], b"in_progress");
    assert_eq!(fields["fp"], [42; 32]);
    assert_eq!(fields["fpv"], b"1");
    assert_eq!(fields["token"], token.0.to_string().as_bytes());
    let ms = |name: &str| -> i64 { String::from_utf8_lossy(&fields[name]).parse().unwrap() };
    assert_eq!(
        ms("expires_at") - ms("lease_expires_at"),
        3_600_000 - 30_000
    );
    assert_eq!(ms("expires_at") - ms("created_at"), 3_600_000);

    let response = StoredResponse {
        status: 202,
        headers: vec![("x-a".to_owned(), b"1".to_vec())],
        body: Some(Bytes::from_static(b"done")),
    };
    assert!(
        store
            .complete("acct_alice", "k-1", token, &response)
            .await
            .unwrap()
    );
    let fields: std::collections::HashMap<String, Vec<u8>> = conn.hgetall(&key).await.unwrap();
    assert_eq!(fields["state"], b"completed");
    assert_eq!(fields["status"], b"202");
    assert_eq!(
        fields["headers"],
        idempotent_runtime::store::encode_headers(&response.headers)
    );
    assert_eq!(fields["body"], b"done");

    // A body over the cap is no field at all; an empty body an empty field.
    for (name, body) in [("none", None), ("empty", Some(Bytes::new()))] {
        let token = FencingToken::random();
        must_claim(&store, &claim_request(name, token)).await;
        let response = StoredResponse {
            status: 200,
            headers: Vec::new(),
            body: body.clone(),
        };
        assert!(
            store
                .complete("acct_alice", name, token, &response)
                .await
                .unwrap()
        );
        let stored_body: Option<Vec<u8>> = conn
            .hget(store.record_key("acct_alice", name), "body")
            .await
            .unwrap();
        assert_eq!(stored_body.map(Bytes::from), body, "{name}");
    }
}

async fn records_carry_a_redis_expiry_at_the_end_of_their_ttl_or_lease() {
    let url = redis_url();
    let prefix = TestPrefix::new(&url);
    let store = prefix.store().await;
    let mut conn = store.connection().clone();
    let pttl = |key: &str| {
        let key = store.record_key("acct_alice", key);
        let mut conn = conn.clone();
        async move { conn.pttl::<_, i64>(key).await.unwrap() }
    };

    // A fresh claim: the TTL.
    let token = FencingToken::random();
    must_claim(&store, &claim_request("ttl", token)).await;
    let left = pttl("ttl").await;
    assert!(left > 3_590_000 && left <= 3_600_000, "{left}");
    // Completed: still the TTL from the claim.
    assert!(
        store
            .complete("acct_alice", "ttl", token, &stored(b"{}"))
            .await
            .unwrap()
    );
    let left = pttl("ttl").await;
    assert!(left > 3_590_000 && left <= 3_600_000, "{left}");

    // A renewal keeps the record a whole TTL from the renewal, and completion keeps it
    // there.
    let short = |key: &'static str, token| ClaimRequest {
        ttl: Duration::from_secs(20),
        lease: Duration::from_secs(10),
        ..claim_request(key, token)
    };
    let token = FencingToken::random();
    must_claim(&store, &short("renewed", token)).await;
    let left = pttl("renewed").await;
    assert!(left > 10_000 && left <= 20_000, "{left}");
    assert!(
        store
            .renew(
                "acct_alice",
                "renewed",
                token,
                Duration::from_secs(10),
                Duration::from_secs(60)
            )
            .await
            .unwrap()
    );
    let left = pttl("renewed").await;
    assert!(left > 50_000 && left <= 60_000, "{left}");
    assert!(
        store
            .complete("acct_alice", "renewed", token, &stored(b"{}"))
            .await
            .unwrap()
    );
    let left = pttl("renewed").await;
    assert!(left > 50_000 && left <= 60_000, "{left}");

    // A claim whose lease outlasts its TTL lives until the lease end.
    let token = FencingToken::random();
    let long_lease = ClaimRequest {
        ttl: Duration::from_secs(1),
        lease: Duration::from_secs(20),
        ..claim_request("long-lease", token)
    };
    must_claim(&store, &long_lease).await;
    let left = pttl("long-lease").await;
    assert!(left > 10_000 && left <= 20_000, "{left}");

    // Redis removes an expired record by itself, on its own clock; the key is free.
    let token = FencingToken::random();
    let brief = ClaimRequest {
        ttl: Duration::from_millis(300),
        lease: Duration::from_millis(100),
        ..claim_request("brief", token)
    };
    must_claim(&store, &brief).await;
    assert!(
        store
            .complete("acct_alice", "brief", token, &stored(b"{}"))
            .await
            .unwrap()
    );
    let key = store.record_key("acct_alice", "brief");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while conn.exists::<_, bool>(&key).await.unwrap() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "Redis never expired the record"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let other = Fingerprint {
        version: 1,
        digest: [7; 32],
    };
    let token = FencingToken::random();
    must_claim(
        &store,
        &ClaimRequest {
            fingerprint: &other,
            ..claim_request("brief", token)
        },
    )
    .await;
    // Nothing was left for purge_expired to count.
    assert_eq!(store.purge_expired(100).await.unwrap(), 0);
}

async fn a_corrupt_record_is_reported_not_overwritten() {
    let url = redis_url();
    let prefix = TestPrefix::new(&url);
    let store = prefix.store().await;
    let key = store.record_key("acct_alice", "bad");
    let mut conn = store.connection().clone();
    let () = conn.hset(&key, "state", "bogus").await.unwrap();
    let error = store
        .claim(&claim_request("bad", FencingToken::random()))
        .await
        .map(|answer| answer.outcome)
        .expect_err("a record without valid fields");
    assert!(matches!(error, StoreError::Corrupt(_)), "{error:?}");
    let state: String = conn.hget(&key, "state").await.unwrap();
    assert_eq!(state, "bogus", "left for an operator to inspect");
    // A key of another type under the prefix is a Redis error, not a claim.
    let key = store.record_key("acct_alice", "string");
    let () = conn.set(&key, "x").await.unwrap();
    let error = store
        .claim(&claim_request("string", FencingToken::random()))
        .await
        .map(|answer| answer.outcome)
        .expect_err("a string where a hash belongs");
    assert!(matches!(error, StoreError::Redis(_)), "{error:?}");
    // Neither stops a purge of the records around them.
    let token = FencingToken::random();
    must_claim(
        &store,
        &ClaimRequest {
            ttl: Duration::from_secs(60),
            lease: Duration::from_secs(1),
            ..claim_request("expiring", token)
        },
    )
    .await;
    shift_back(store.connection(), &prefix.prefix, Duration::from_secs(61)).await;
    assert_eq!(store.purge_expired(100).await.unwrap(), 1);
}

async fn scripts_are_loaded_again_after_the_server_forgets_them() {
    let url = redis_url();
    let prefix = TestPrefix::new(&url);
    let store = prefix.store().await;
    let token = FencingToken::random();
    must_claim(&store, &claim_request("k", token)).await;
    // What a restart or a failover to a fresh replica does to the script cache. (Other
    // tests running now simply load their scripts again too.)
    let mut conn = store.connection().clone();
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        store
            .complete("acct_alice", "k", token, &stored(b"{}"))
            .await
            .unwrap()
    );
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        store
            .claim(&claim_request("k", FencingToken::random()))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::Replay(stored(b"{}"))
    );
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    shift_back(store.connection(), &prefix.prefix, TTL).await;
    assert_eq!(store.purge_expired(10).await.unwrap(), 1);
}

/// A TCP proxy in front of the server that, for the first `flushes` replies to a
/// `SCRIPT LOAD`, flushes the server's scripts before passing the reply on: the client's
/// `EVALSHA` right after its load finds the script gone, as after a `SCRIPT FLUSH` or a
/// failover between the two. Returns its port.
async fn flushing_proxy(target: String, flushes: usize) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let left = Arc::new(AtomicU64::new(flushes as u64));
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::TcpStream::connect(target.as_str())
                .await
                .unwrap();
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            let loading = Arc::new(AtomicBool::new(false));
            let seen = Arc::clone(&loading);
            tokio::spawn(async move {
                let mut buf = vec![0; 64 * 1024];
                while let Ok(n @ 1..) = client_read.read(&mut buf).await {
                    if buf[..n].windows(4).any(|w| w == b"LOAD") {
                        seen.store(true, Ordering::SeqCst);
                    }
                    if server_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
            let (target, left) = (target.clone(), Arc::clone(&left));
            tokio::spawn(async move {
                let mut buf = vec![0; 64 * 1024];
                while let Ok(n @ 1..) = server_read.read(&mut buf).await {
                    let take_one = |n: u64| n.checked_sub(1);
                    if loading.swap(false, Ordering::SeqCst)
                        && left
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, take_one)
                            .is_ok()
                    {
                        let mut flusher = redis::Client::open(format!("redis://{target}/"))
                            .unwrap()
                            .get_multiplexed_async_connection()
                            .await
                            .unwrap();
                        redis::cmd("SCRIPT")
                            .arg("FLUSH")
                            .exec_async(&mut flusher)
                            .await
                            .unwrap();
                    }
                    if client_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

async fn a_script_forgotten_right_after_its_load_is_loaded_again() {
    let url = redis_url();
    let parsed = url::Url::parse(&url).unwrap();
    let (Some(host), Some(port)) = (parsed.host_str(), parsed.port_or_known_default()) else {
        eprintln!("skipped: the proxy needs a TCP URL");
        return;
    };
    let prefix = TestPrefix::new(&url);
    let proxy = flushing_proxy(format!("{host}:{port}"), 2).await;
    let mut proxied = parsed.clone();
    proxied.set_host(Some("127.0.0.1")).unwrap();
    proxied.set_port(Some(proxy)).unwrap();
    let store = RedisStore::builder()
        .key_prefix(&prefix.prefix)
        .connect(proxied.as_str())
        .await
        .unwrap();
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .exec_async(&mut store.connection().clone())
        .await
        .unwrap();
    // The insert script is loaded three times: forgotten after the first two loads.
    let token = FencingToken::random();
    must_claim(&store, &claim_request("k", token)).await;
    assert!(
        store
            .complete("acct_alice", "k", token, &stored(b"{}"))
            .await
            .unwrap()
    );
}

async fn purge_leaves_other_prefixes_alone() {
    let url = redis_url();
    let mine = TestPrefix::new(&url);
    // A prefix that extends mine: a careless MATCH pattern would take its keys too.
    let longer = TestPrefix {
        url: url.clone(),
        prefix: format!("{}x", mine.prefix),
    };
    let store = mine.store().await;
    let neighbour = longer.store().await;
    must_claim(&store, &claim_request("k", FencingToken::random())).await;
    must_claim(&neighbour, &claim_request("k", FencingToken::random())).await;
    // Both prefixes' records are expired: a careless pattern would purge the neighbour's.
    shift_back(store.connection(), &mine.prefix, TTL).await;
    shift_back(store.connection(), &longer.prefix, TTL).await;
    assert_eq!(store.purge_expired(100).await.unwrap(), 1);
    assert_eq!(keys_under(&url, &longer.prefix).unwrap().len(), 1);
}

async fn debug_names_the_location_without_a_password() {
    let url = redis_url();
    let prefix = TestPrefix::new(&url);
    let store = prefix.store().await;
    let debug = format!("{store:?}");
    assert!(debug.contains(&prefix.prefix), "{debug}");
    assert!(debug.contains("RedisStore"), "{debug}");
    let parsed = url::Url::parse(&url).unwrap();
    assert!(debug.contains(parsed.host_str().unwrap_or("")), "{debug}");
    if let Some(password) = parsed.password() {
        assert!(!debug.contains(password), "{debug}");
    }
}

async fn steps_are_a_field_of_the_hash_that_complete_deletes_and_release_keeps() {
    let url = redis_url();
    let prefix = TestPrefix::new(&url);
    let store = prefix.store().await;
    let mut conn = store.connection().clone();
    let (first, second) = (step("authorise", r#"{"id":"a_1"}"#), step("capture", "7"));

    // Appended in recording order to one field, the concatenation of encode_step.
    let token = FencingToken::random();
    must_claim(&store, &claim_request("k", token)).await;
    let key = store.record_key("acct_alice", "k");
    let none: Option<Vec<u8>> = conn.hget(&key, "steps").await.unwrap();
    assert_eq!(none, None, "a claim writes no steps field");
    assert!(
        store
            .record_step("acct_alice", "k", token, &first)
            .await
            .unwrap()
    );
    assert!(
        store
            .record_step("acct_alice", "k", token, &second)
            .await
            .unwrap()
    );
    let stored_steps: Vec<u8> = conn.hget(&key, "steps").await.unwrap();
    assert_eq!(
        stored_steps,
        [encode_step(&first), encode_step(&second)].concat()
    );
    // Another token appends nothing.
    assert!(
        !store
            .record_step("acct_alice", "k", FencingToken::random(), &second)
            .await
            .unwrap()
    );
    let unchanged: Vec<u8> = conn.hget(&key, "steps").await.unwrap();
    assert_eq!(unchanged, stored_steps);

    // Release keeps the record: in progress, its lease ended at the script's now, its token
    // RELEASED, its Redis expiry no earlier than the end of its TTL.
    let before = server_now_ms(&mut conn).await;
    assert!(store.release("acct_alice", "k", token).await.unwrap());
    let after = server_now_ms(&mut conn).await;
    let fields: std::collections::HashMap<String, Vec<u8>> = conn.hgetall(&key).await.unwrap();
    assert_eq!(fields["state"], b"in_progress");
    assert_eq!(fields["steps"], stored_steps);
    assert_eq!(
        fields["token"],
        FencingToken::RELEASED.0.to_string().as_bytes()
    );
    assert!(
        !store.release("acct_alice", "k", token).await.unwrap(),
        "the released token owns nothing"
    );
    let lease_end: i64 = String::from_utf8_lossy(&fields["lease_expires_at"])
        .parse()
        .unwrap();
    assert!(
        before <= lease_end && lease_end <= after,
        "{before} {lease_end} {after}"
    );
    let expires_at: i64 = String::from_utf8_lossy(&fields["expires_at"])
        .parse()
        .unwrap();
    let pexpiretime: i64 = redis::cmd("PEXPIRETIME")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(pexpiretime >= expires_at, "{pexpiretime} {expires_at}");

    // The same request takes it over at once and gets the steps back; completing it
    // deletes the field.
    let next = must_resume(&store, "k", vec![first.clone(), second.clone()]).await;
    let carried: Vec<u8> = conn.hget(&key, "steps").await.unwrap();
    assert_eq!(
        carried, stored_steps,
        "the takeover rewrote the record with its steps"
    );
    assert!(
        store
            .complete("acct_alice", "k", next, &stored(b"{}"))
            .await
            .unwrap()
    );
    let gone: Option<Vec<u8>> = conn.hget(&key, "steps").await.unwrap();
    assert_eq!(gone, None);

    // A release without steps still deletes the key.
    let token = FencingToken::random();
    must_claim(&store, &claim_request("bare", token)).await;
    assert!(store.release("acct_alice", "bare", token).await.unwrap());
    let exists: bool = conn
        .exists(store.record_key("acct_alice", "bare"))
        .await
        .unwrap();
    assert!(!exists);
}

async fn an_expired_records_steps_end_with_it_and_operators_see_steps_in_progress_only() {
    let url = redis_url();
    let prefix = TestPrefix::new(&url);
    let store = prefix.store().await;
    let token = FencingToken::random();
    must_claim(&store, &claim_request("k", token)).await;
    let charged = step("charge", "1");
    assert!(
        store
            .record_step("acct_alice", "k", token, &charged)
            .await
            .unwrap()
    );
    let info = store.inspect("acct_alice", "k").await.unwrap().unwrap();
    assert!(matches!(info.state, RecordState::InProgress { .. }));
    assert_eq!(info.steps, std::slice::from_ref(&charged));
    // Past its TTL: a takeover starts a new lifetime without the steps.
    shift_back(
        store.connection(),
        &prefix.prefix,
        TTL + Duration::from_secs(1),
    )
    .await;
    let next = FencingToken::random();
    assert_eq!(
        store
            .claim(&claim_request("k", next))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::Claimed {
            token: next,
            takeover: Some(Takeover::Expired),
            steps: Vec::new(),
        }
    );
    let mut conn = store.connection().clone();
    let field: Option<Vec<u8>> = conn
        .hget(store.record_key("acct_alice", "k"), "steps")
        .await
        .unwrap();
    assert_eq!(field, None);
    // Forgetting a released record with steps answers them, then they are gone too.
    assert!(
        store
            .record_step("acct_alice", "k", next, &charged)
            .await
            .unwrap()
    );
    assert!(store.release("acct_alice", "k", next).await.unwrap());
    match store.forget("acct_alice", "k", false).await.unwrap() {
        idempotent_runtime::ForgetOutcome::Forgotten(info) => {
            assert_eq!(info.steps, [charged]);
            assert!(!info.holder_alive());
        }
        other => panic!("expected Forgotten, got {other:?}"),
    }
    let exists: bool = conn
        .exists(store.record_key("acct_alice", "k"))
        .await
        .unwrap();
    assert!(!exists);
}

/// A TCP proxy in front of the server that counts turns: a turn begins each time the
/// client sends after the server last spoke. Returns its port.
async fn counting_proxy(target: String, turns: Arc<AtomicU64>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::TcpStream::connect(target.as_str())
                .await
                .unwrap();
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            let server_spoke_last = Arc::new(AtomicBool::new(true));
            let (up, spoke) = (Arc::clone(&turns), Arc::clone(&server_spoke_last));
            tokio::spawn(async move {
                let mut buf = vec![0; 64 * 1024];
                while let Ok(n @ 1..) = client_read.read(&mut buf).await {
                    if spoke.swap(false, Ordering::SeqCst) {
                        up.fetch_add(1, Ordering::SeqCst);
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

/// How many turns `operation` took.
async fn turns_of(turns: &AtomicU64, operation: impl Future<Output = ()>) -> u64 {
    let before = turns.load(Ordering::SeqCst);
    operation.await;
    turns.load(Ordering::SeqCst) - before
}

async fn every_hot_operation_is_one_round_trip_and_a_takeover_two() {
    let url = redis_url();
    let parsed = url::Url::parse(&url).unwrap();
    let (Some(host), Some(port)) = (parsed.host_str(), parsed.port_or_known_default()) else {
        eprintln!("skipped: the round-trip count needs a TCP URL");
        return;
    };
    let prefix = TestPrefix::new(&url);
    let turns = Arc::new(AtomicU64::new(0));
    let proxy = counting_proxy(format!("{host}:{port}"), Arc::clone(&turns)).await;
    let mut proxied = parsed.clone();
    proxied.set_host(Some("127.0.0.1")).unwrap();
    proxied.set_port(Some(proxy)).unwrap();
    let store = RedisStore::builder()
        .key_prefix(&prefix.prefix)
        .connect(proxied.as_str())
        .await
        .unwrap();
    // Warm up: the first use of each script loads it (EVALSHA, SCRIPT LOAD, EVALSHA).
    let token = FencingToken::random();
    must_claim(&store, &claim_request("warm", token)).await;
    assert!(
        store
            .complete("acct_alice", "warm", token, &stored(b"{}"))
            .await
            .unwrap()
    );
    let token = FencingToken::random();
    must_claim(&store, &claim_request("warm-steps", token)).await;
    assert!(
        store
            .record_step("acct_alice", "warm-steps", token, &step("a", "1"))
            .await
            .unwrap()
    );
    assert!(
        store
            .release("acct_alice", "warm-steps", token)
            .await
            .unwrap()
    );
    let token = FencingToken::random();
    must_claim(&store, &claim_request("warm-bare", token)).await;
    assert!(
        store
            .release("acct_alice", "warm-bare", token)
            .await
            .unwrap()
    );
    for key in ["a", "b", "c"] {
        let token = FencingToken::random();
        let claimed = turns_of(&turns, must_claim(&store, &claim_request(key, token))).await;
        assert_eq!(claimed, 1, "a fresh claim");
        let in_progress = turns_of(&turns, async {
            let outcome = store
                .claim(&claim_request(key, FencingToken::random()))
                .await
                .unwrap()
                .outcome;
            assert!(matches!(outcome, ClaimOutcome::InProgress { .. }));
        })
        .await;
        assert_eq!(in_progress, 1, "a duplicate in progress");
        let renewed = turns_of(&turns, async {
            assert!(
                store
                    .renew("acct_alice", key, token, LEASE, TTL)
                    .await
                    .unwrap()
            );
        })
        .await;
        assert_eq!(renewed, 1, "a renewal");
        let recorded = turns_of(&turns, async {
            assert!(
                store
                    .record_step("acct_alice", key, token, &step("a", "1"))
                    .await
                    .unwrap()
            );
        })
        .await;
        assert_eq!(recorded, 1, "a step");
        let completed = turns_of(&turns, async {
            assert!(
                store
                    .complete("acct_alice", key, token, &stored(b"{}"))
                    .await
                    .unwrap()
            );
        })
        .await;
        assert_eq!(completed, 1, "a completion");
        let replayed = turns_of(&turns, async {
            let outcome = store
                .claim(&claim_request(key, FencingToken::random()))
                .await
                .unwrap()
                .outcome;
            assert_eq!(outcome, ClaimOutcome::Replay(stored(b"{}")));
        })
        .await;
        assert_eq!(replayed, 1, "a replay, response included");
        let other = Fingerprint {
            version: 1,
            digest: [7; 32],
        };
        let mismatched = turns_of(&turns, async {
            let request = ClaimRequest {
                fingerprint: &other,
                ..claim_request(key, FencingToken::random())
            };
            let outcome = store.claim(&request).await.unwrap().outcome;
            assert_eq!(outcome, ClaimOutcome::Mismatch);
        })
        .await;
        assert_eq!(mismatched, 1, "a mismatch");
    }
    // The rare paths: a release reads, then deletes or ends the lease; a takeover reads
    // (the insert answers the record), then compares and sets.
    let token = FencingToken::random();
    must_claim(&store, &claim_request("bare", token)).await;
    let released = turns_of(&turns, async {
        assert!(store.release("acct_alice", "bare", token).await.unwrap());
    })
    .await;
    assert_eq!(released, 2, "a release that deletes the record");
    let token = FencingToken::random();
    must_claim(&store, &claim_request("steps", token)).await;
    assert!(
        store
            .record_step("acct_alice", "steps", token, &step("a", "1"))
            .await
            .unwrap()
    );
    let released = turns_of(&turns, async {
        assert!(store.release("acct_alice", "steps", token).await.unwrap());
    })
    .await;
    assert_eq!(released, 2, "a release that keeps the record");
    let resumed = turns_of(&turns, async {
        must_resume(&store, "steps", vec![step("a", "1")]).await;
    })
    .await;
    assert_eq!(resumed, 2, "a takeover, steps included");
    let token = FencingToken::random();
    must_claim(&store, &claim_request("crashed", token)).await;
    shift_back(store.connection(), &prefix.prefix, LEASE).await;
    let taken = turns_of(&turns, async {
        must_resume(&store, "crashed", Vec::new()).await;
    })
    .await;
    assert_eq!(taken, 2, "a takeover of a lost lease");
    // The sweeper: its candidates cost a `SCAN` and a pipeline of reads per step of the
    // scan (how many steps depends on the whole server's keys), and the deletes of all
    // the records it judged expired one pipeline.
    shift_back(store.connection(), &prefix.prefix, TTL).await;
    let (expired, _) = store.records().past_expiry(100).await.unwrap();
    assert!(expired.len() >= 5, "{expired:?}");
    let versions: Vec<(&str, &str, u64)> = expired
        .iter()
        .map(|c| (c.scope.as_str(), c.key.as_str(), c.record.version))
        .collect();
    let deleted = turns_of(&turns, async {
        let deleted = store.records().delete_many(&versions).await.unwrap();
        assert_eq!(deleted, versions.len() as u64);
    })
    .await;
    assert_eq!(deleted, 1, "the deletes of {} records", versions.len());
}

pub(crate) fn trials() -> Vec<Trial> {
    let mut trials = conformance::trials::<RedisHarness>();
    trials.extend(conformance::record_trials::<RedisHarness>());
    // Without a server.
    trials.push(async_trial(
        "unreachable_server_is_an_open_error_naming_the_redacted_url",
        unreachable_server_is_an_open_error_naming_the_redacted_url,
    ));
    trials.push(async_trial(
        "prefixes_with_braces_are_refused_before_connecting",
        prefixes_with_braces_are_refused_before_connecting,
    ));
    let with_server: Vec<Trial> = vec![
        async_trial(
            "a_wrong_password_is_refused_without_echoing_it",
            a_wrong_password_is_refused_without_echoing_it,
        ),
        async_trial(
            "records_are_one_hash_under_the_prefix_with_a_hash_tag_over_scope_and_key",
            records_are_one_hash_under_the_prefix_with_a_hash_tag_over_scope_and_key,
        ),
        async_trial(
            "records_carry_a_redis_expiry_at_the_end_of_their_ttl_or_lease",
            records_carry_a_redis_expiry_at_the_end_of_their_ttl_or_lease,
        ),
        async_trial(
            "a_corrupt_record_is_reported_not_overwritten",
            a_corrupt_record_is_reported_not_overwritten,
        ),
        async_trial(
            "scripts_are_loaded_again_after_the_server_forgets_them",
            scripts_are_loaded_again_after_the_server_forgets_them,
        ),
        async_trial(
            "a_script_forgotten_right_after_its_load_is_loaded_again",
            a_script_forgotten_right_after_its_load_is_loaded_again,
        ),
        async_trial(
            "purge_leaves_other_prefixes_alone",
            purge_leaves_other_prefixes_alone,
        ),
        async_trial(
            "debug_names_the_location_without_a_password",
            debug_names_the_location_without_a_password,
        ),
        async_trial(
            "every_hot_operation_is_one_round_trip_and_a_takeover_two",
            every_hot_operation_is_one_round_trip_and_a_takeover_two,
        ),
        async_trial(
            "steps_are_a_field_of_the_hash_that_complete_deletes_and_release_keeps",
            steps_are_a_field_of_the_hash_that_complete_deletes_and_release_keeps,
        ),
        async_trial(
            "the_register_applies_each_change_as_the_seam_defines_it",
            upgrade::the_register_applies_each_change_as_the_seam_defines_it,
        ),
        async_trial(
            "records_of_the_previous_release_replay_resume_and_complete",
            upgrade::records_of_the_previous_release_replay_resume_and_complete,
        ),
        async_trial(
            "the_previous_releases_writes_move_a_record_without_a_version",
            upgrade::the_previous_releases_writes_move_a_record_without_a_version,
        ),
        async_trial(
            "an_expired_records_steps_end_with_it_and_operators_see_steps_in_progress_only",
            an_expired_records_steps_end_with_it_and_operators_see_steps_in_progress_only,
        ),
    ];
    trials.extend(ignored_if(unavailable(), with_server));
    trials
}
