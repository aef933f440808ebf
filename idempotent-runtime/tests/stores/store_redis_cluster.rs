//! The conformance suite on [`RedisStore`] over a Redis Cluster, plus what only a cluster
//! has: records spread over every primary and `purge_expired` reaching them all, steps
//! recorded, released and resumed on every primary, scripts reloaded on every node, and a
//! primary killed mid-traffic (`failover`). Several cluster clients (instances) race in
//! the conformance suite's `check_instances_…`.
//!
//! Needs `IDEMPOTENT_TEST_REDIS_CLUSTER_URL` (e.g. `redis+cluster://127.0.0.1:7000/`, the
//! cluster `scripts/redis-cluster.sh start` makes); without it every server test is
//! reported as ignored. Each test works under a key prefix of its own whose keys are
//! deleted when the test ends. The failover test kills nodes, so it runs on a cluster of
//! its own (ports 7100–7105), started and stopped by the same script.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idempotent_runtime::store::RecordStore;
use idempotent_runtime::store::{ClaimOutcome, ClaimRequest, FencingToken, Takeover};
use idempotent_runtime::store::{RedisConnection, RedisStore};
use idempotent_runtime::testing::conformance::{self, Harness, RecordsHarness};
use idempotent_runtime::testing::{Trial, async_trial, ignored_if};
use idempotent_runtime::{Store, StoreError};

use crate::fixtures::{TTL, claim_request, stored};
use crate::store_redis::{must_claim, shift_back, step};

mod failover;

const URL_VAR: &str = "IDEMPOTENT_TEST_REDIS_CLUSTER_URL";

/// Why the cluster tests cannot run here, if they cannot.
fn unavailable() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => None,
        _ => Some(format!(
            "{URL_VAR} is not set (e.g. redis+cluster://127.0.0.1:7000/ after \
             scripts/redis-cluster.sh start)"
        )),
    }
}

/// The cluster URL; only called by tests that run when [`unavailable`] said nothing.
fn cluster_url() -> String {
    std::env::var(URL_VAR).unwrap_or_else(|_| panic!("{URL_VAR} is not set"))
}

/// A key prefix that exists for one test: its keys (on every primary) are deleted when
/// the guard is dropped.
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

/// Every key under `prefix`, on every primary (the cluster client sends `KEYS` to each
/// primary and joins the answers).
async fn keys_under(conn: &RedisConnection, prefix: &str) -> redis::RedisResult<Vec<String>> {
    redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut conn.clone())
        .await
}

impl Drop for TestPrefix {
    fn drop(&mut self) {
        let (url, prefix) = (self.url.clone(), self.prefix.clone());
        // `Drop` cannot await and the test's runtime may be shutting down: a thread with a
        // runtime of its own.
        let outcome = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(async {
                    let store = RedisStore::connect(&url).await.map_err(|e| e.to_string())?;
                    let mut conn = store.connection().clone();
                    let keys = keys_under(&conn, &prefix)
                        .await
                        .map_err(|e| e.to_string())?;
                    if !keys.is_empty() {
                        // The cluster client splits a DEL over slots by itself.
                        redis::cmd("DEL")
                            .arg(&keys)
                            .exec_async(&mut conn)
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                    Ok::<(), String>(())
                })
        })
        .join();
        // Never panic in Drop (the test may already be unwinding); say it loudly.
        if let Ok(Err(e)) = outcome {
            eprintln!("warning: could not delete test keys {}:*: {e}", self.prefix);
        }
    }
}

/// A fresh [`RedisStore`] on the cluster under its own prefix; time moves by
/// [`shift_back`], as on one server.
struct RedisClusterHarness {
    store: Arc<RedisStore>,
    prefix: TestPrefix,
}

#[async_trait::async_trait]
impl Harness for RedisClusterHarness {
    fn unavailable() -> Option<String> {
        unavailable()
    }

    async fn new() -> Self {
        let prefix = TestPrefix::new(&cluster_url());
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

impl RecordsHarness for RedisClusterHarness {
    fn records(&self) -> &dyn RecordStore {
        self.store.records()
    }
}

/// The cluster's primaries as `redis://host:port/` URLs, read from `CLUSTER NODES` on
/// `seed` (a plain connection to one node: `redis://host:port/`).
fn primaries_of(seed: &str) -> Vec<String> {
    let mut conn = redis::Client::open(seed)
        .and_then(|c| c.get_connection())
        .unwrap_or_else(|e| panic!("connect to the cluster node {seed}: {e}"));
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query(&mut conn)
        .expect("CLUSTER NODES");
    // `<id> <host:port@bus-port> <flags> …`, one node a line.
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let flags = fields.get(2)?;
            (flags.contains("master") && !flags.contains("fail")).then(|| {
                let address = fields[1].split('@').next().unwrap_or_default();
                format!("redis://{address}/")
            })
        })
        .collect()
}

/// The first seed of a `redis+cluster://host:port[,…]/` URL as a plain `redis://` URL.
fn first_seed(url: &str) -> String {
    let rest = url
        .strip_prefix("redis+cluster://")
        .unwrap_or_else(|| panic!("{URL_VAR} is not a redis+cluster:// URL: {url}"));
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let first = authority.split(',').next().unwrap_or_default();
    format!("redis://{first}/")
}

/// How many keys under `prefix` the primary at `node` (`redis://host:port/`) holds.
fn keys_on(node: &str, prefix: &str) -> usize {
    let mut conn = redis::Client::open(node)
        .and_then(|c| c.get_connection())
        .expect("connect to a primary");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query(&mut conn)
        .expect("KEYS on one primary");
    keys.len()
}

async fn an_unreachable_cluster_is_an_open_error_naming_the_redacted_seeds() {
    // Needs no server: nothing listens on port 1.
    let error = RedisStore::connect("redis+cluster://idem_user:hunter2@127.0.0.1:1,127.0.0.1:2/")
        .await
        .expect_err("nothing listens on ports 1 and 2");
    let text = format!("{error} {error:?}");
    match &error {
        StoreError::Open { location, .. } => assert_eq!(
            location,
            "redis+cluster [redis://idem_user:***@127.0.0.1:1/, redis://idem_user:***@127.0.0.1:2/]"
        ),
        other => panic!("expected StoreError::Open, got {other:?}"),
    }
    assert!(!text.contains("hunter2"), "{text}");
    let error = RedisStore::connect_cluster(Vec::<String>::new())
        .await
        .expect_err("no seed");
    assert!(matches!(error, StoreError::Open { .. }), "{error:?}");
    let error = RedisStore::connect("redis+cluster:///")
        .await
        .expect_err("no seed in the URL");
    assert!(matches!(error, StoreError::Open { .. }), "{error:?}");
}

async fn the_url_and_the_seed_list_open_the_same_cluster() {
    let url = cluster_url();
    let prefix = TestPrefix::new(&url);
    let by_url = prefix.store().await;
    assert!(
        by_url.connection_manager().is_none(),
        "a cluster connection"
    );
    assert!(matches!(by_url.connection(), RedisConnection::Cluster(_)));
    let seed = first_seed(&url);
    let by_seeds = RedisStore::builder()
        .key_prefix(&prefix.prefix)
        .connect_cluster([seed.as_str()])
        .await
        .expect("connect through the seed list");
    let debug = format!("{by_seeds:?}");
    assert!(debug.contains("redis+cluster"), "{debug}");
    assert!(debug.contains(&prefix.prefix), "{debug}");
    let token = FencingToken::random();
    must_claim(&by_url, &claim_request("k", token)).await;
    assert!(
        by_url
            .complete("acct_alice", "k", token, &stored(b"one"))
            .await
            .unwrap()
    );
    assert_eq!(
        by_seeds
            .claim(&claim_request("k", FencingToken::random()))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::Replay(stored(b"one"))
    );
}

async fn records_spread_over_every_primary_and_purge_reaches_them_all() {
    let url = cluster_url();
    let prefix = TestPrefix::new(&url);
    let store = prefix.store().await;
    const RECORDS: usize = 90;
    for i in 0..RECORDS {
        let (key, token) = (format!("k-{i}"), FencingToken::random());
        let request = ClaimRequest {
            ttl: Duration::from_secs(60),
            lease: Duration::from_secs(1),
            ..claim_request(&key, token)
        };
        must_claim(&store, &request).await;
    }
    let primaries = primaries_of(&first_seed(&url));
    assert_eq!(primaries.len(), 3, "{primaries:?}");
    let held: Vec<usize> = primaries
        .iter()
        .map(|node| keys_on(node, &prefix.prefix))
        .collect();
    assert_eq!(held.iter().sum::<usize>(), RECORDS, "{held:?}");
    // The hash tag spreads scopes and keys over the slots, so over every primary.
    assert!(held.iter().all(|&n| n > 0), "{held:?}");

    // Nothing is expired yet: a purge deletes nothing, anywhere.
    assert_eq!(store.purge_expired(1000).await.unwrap(), 0);
    shift_back(store.connection(), &prefix.prefix, Duration::from_secs(61)).await;
    // The limit holds across primaries, and the rest is found on a later call.
    assert_eq!(store.purge_expired(25).await.unwrap(), 25);
    assert_eq!(
        store.purge_expired(1000).await.unwrap(),
        u64::try_from(RECORDS - 25).unwrap()
    );
    for node in &primaries {
        assert_eq!(keys_on(node, &prefix.prefix), 0, "{node}");
    }
}

async fn steps_are_recorded_released_and_resumed_on_every_primary() {
    let url = cluster_url();
    let prefix = TestPrefix::new(&url);
    let store = prefix.store().await;
    const RECORDS: usize = 30;
    let steps = [step("authorise", "1"), step("capture", "2")];
    for i in 0..RECORDS {
        let (key, token) = (format!("k-{i}"), FencingToken::random());
        must_claim(&store, &claim_request(&key, token)).await;
        for step in &steps {
            assert!(
                store
                    .record_step("acct_alice", &key, token, step)
                    .await
                    .unwrap()
            );
        }
        assert!(store.release("acct_alice", &key, token).await.unwrap());
    }
    // Released records with steps are kept, on every primary.
    let held: Vec<usize> = primaries_of(&first_seed(&url))
        .iter()
        .map(|node| keys_on(node, &prefix.prefix))
        .collect();
    assert_eq!(held.iter().sum::<usize>(), RECORDS, "{held:?}");
    assert!(held.iter().all(|&n| n > 0), "{held:?}");
    for i in 0..RECORDS {
        let (key, token) = (format!("k-{i}"), FencingToken::random());
        assert_eq!(
            store
                .claim(&claim_request(&key, token))
                .await
                .unwrap()
                .outcome,
            ClaimOutcome::Claimed {
                token,
                takeover: Some(Takeover::LeaseLost),
                steps: steps.to_vec(),
            },
            "{key}"
        );
        assert!(
            store
                .complete("acct_alice", &key, token, &stored(b"{}"))
                .await
                .unwrap()
        );
        let info = store.inspect("acct_alice", &key).await.unwrap().unwrap();
        assert!(info.steps.is_empty(), "{key}: completed");
    }
}

async fn scripts_are_loaded_again_after_every_node_forgets_them() {
    let url = cluster_url();
    let prefix = TestPrefix::new(&url);
    let store = prefix.store().await;
    let flush_everywhere = || async {
        // The cluster client sends SCRIPT FLUSH to every node.
        redis::cmd("SCRIPT")
            .arg("FLUSH")
            .exec_async(&mut store.connection().clone())
            .await
            .unwrap();
    };
    let token = FencingToken::random();
    must_claim(&store, &claim_request("k", token)).await;
    flush_everywhere().await;
    assert!(
        store
            .complete("acct_alice", "k", token, &stored(b"{}"))
            .await
            .unwrap()
    );
    flush_everywhere().await;
    assert_eq!(
        store
            .claim(&claim_request("k", FencingToken::random()))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::Replay(stored(b"{}"))
    );
    flush_everywhere().await;
    shift_back(store.connection(), &prefix.prefix, TTL).await;
    assert_eq!(store.purge_expired(10).await.unwrap(), 1);
}

pub(crate) fn trials() -> Vec<Trial> {
    let mut trials = conformance::trials::<RedisClusterHarness>();
    trials.extend(conformance::record_trials::<RedisClusterHarness>());
    // Without a server.
    trials.push(async_trial(
        "an_unreachable_cluster_is_an_open_error_naming_the_redacted_seeds",
        an_unreachable_cluster_is_an_open_error_naming_the_redacted_seeds,
    ));
    let with_cluster: Vec<Trial> = vec![
        async_trial(
            "the_url_and_the_seed_list_open_the_same_cluster",
            the_url_and_the_seed_list_open_the_same_cluster,
        ),
        async_trial(
            "records_spread_over_every_primary_and_purge_reaches_them_all",
            records_spread_over_every_primary_and_purge_reaches_them_all,
        ),
        async_trial(
            "steps_are_recorded_released_and_resumed_on_every_primary",
            steps_are_recorded_released_and_resumed_on_every_primary,
        ),
        async_trial(
            "scripts_are_loaded_again_after_every_node_forgets_them",
            scripts_are_loaded_again_after_every_node_forgets_them,
        ),
        async_trial(
            "failover::a_killed_primary_keeps_replicated_records_and_loses_unreplicated_ones",
            failover::a_killed_primary_keeps_replicated_records_and_loses_unreplicated_ones,
        ),
    ];
    trials.extend(ignored_if(unavailable(), with_cluster));
    trials
}
