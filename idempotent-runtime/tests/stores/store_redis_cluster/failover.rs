//! A primary killed (`SIGKILL`) under the store, its replica promoted by the cluster: what
//! a client sees during the window, which records the new primary has, and that a
//! completion the replica never received is lost — the retry runs the handler again.
//!
//! Runs on a cluster of its own (127.0.0.1:7100–7105, three primaries with a replica
//! each, `cluster-node-timeout` 2 s) that `scripts/redis-cluster.sh` starts and stops, so
//! the other cluster tests never see a node die. Prints what it observed (run with
//! `--nocapture` to read it).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use redis::aio::MultiplexedConnection;
use tower::ServiceExt;

use super::{claim_request, must_claim, primaries_of, stored};
use idempotent_runtime::Idempotency;
use idempotent_runtime::layer::IdempotencyLayer;
use idempotent_runtime::store::RedisStore;
use idempotent_runtime::store::{ClaimOutcome, FencingToken};
use idempotent_runtime::{Store, StoreError};

const BASE_PORT: &str = "7100";
const DIR: &str = "/tmp/idempotent-redis-cluster-failover";
const URL: &str = "redis+cluster://127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102/";
/// Longer than a failover takes here (node timeout 2 s, then an election).
const FAILOVER_DEADLINE: Duration = Duration::from_secs(30);

fn cluster_script(action: &str) {
    let script: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "..",
        "scripts",
        "redis-cluster.sh",
    ]
    .iter()
    .collect();
    let status = std::process::Command::new("bash")
        .arg(&script)
        .arg(action)
        .env("REDIS_CLUSTER_BASE_PORT", BASE_PORT)
        .env("REDIS_CLUSTER_DIR", DIR)
        .status()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    assert!(status.success(), "{} {action}: {status}", script.display());
}

/// The test's own cluster, stopped (and its files removed) when dropped.
struct OwnCluster;

impl OwnCluster {
    async fn start() -> Self {
        tokio::task::spawn_blocking(|| cluster_script("start"))
            .await
            .expect("start the failover cluster");
        OwnCluster
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        cluster_script("stop");
    }
}

async fn node(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("a node URL")
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// The primary (`redis://host:port/`) that owns `key`'s slot, whether or not the key
/// exists: as the first listed primary that answers says — itself, or the node its
/// `MOVED` names. A node the list leaves out while the cluster converges after a
/// failover (flagged `fail?` for a moment) is still found through the others' redirects.
async fn owner_of(primaries: &[String], key: &str) -> String {
    for primary in primaries {
        // A node killed a moment ago may still be listed: ask the next one.
        let Ok(mut conn) = redis::Client::open(primary.as_str())
            .expect("a node URL")
            .get_multiplexed_async_connection()
            .await
        else {
            continue;
        };
        let found: redis::RedisResult<i64> =
            redis::cmd("EXISTS").arg(key).query_async(&mut conn).await;
        match found {
            Ok(_) => return primary.clone(),
            Err(err) => {
                if let Some((address, _slot)) = err.redirect_node() {
                    return format!("redis://{address}/");
                }
            }
        }
    }
    panic!("no primary holds {key}");
}

/// The replica of the primary at `primary`, as `redis://host:port/`.
async fn replica_of(primary: &str) -> String {
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut node(primary).await)
        .await
        .expect("INFO replication");
    // `slave0:ip=127.0.0.1,port=7104,state=online,…`
    let line = info
        .lines()
        .find(|l| l.starts_with("slave0:"))
        .unwrap_or_else(|| panic!("{primary} has no replica: {info}"));
    let field = |name: &str| {
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {line}"))
            .to_owned()
    };
    format!("redis://{}:{}/", field("ip"), field("port"))
}

/// The process id of the node at `url`.
async fn pid_of(url: &str) -> String {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut node(url).await)
        .await
        .expect("INFO server");
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .expect("process_id")
        .trim()
        .to_owned()
}

/// Kills the node whose process id is `pid` without letting it say goodbye: a crash.
fn kill(pid: &str) {
    let status = std::process::Command::new("kill")
        .args(["-9", pid])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -9 {pid}");
}

/// An app whose one route counts its runs, behind the engine on `store`.
fn app(store: RedisStore, runs: Arc<AtomicU32>) -> Router {
    let layer = IdempotencyLayer::new(Idempotency::new(store))
        .scope_with(|_| Some("acct_alice".to_owned()));
    let pay = post(move || {
        runs.fetch_add(1, Ordering::SeqCst);
        async { StatusCode::CREATED }
    });
    Router::new().route("/pay", pay.layer(layer))
}

/// The status and content type of a `POST /pay` with `key`.
async fn pay(app: &Router, key: &str) -> (StatusCode, String) {
    let request = Request::post("/pay")
        .header("idempotency-key", key)
        .body(Body::from("{}"))
        .expect("request");
    let response = app.clone().oneshot(request).await.expect("infallible");
    let content_type = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (response.status(), content_type)
}

/// What the client saw while retrying one claim until the cluster answered it.
struct Window {
    errors: Vec<String>,
    answered_after: Duration,
    outcome: ClaimOutcome,
}

/// Claims `key` (same fingerprint, a new token each time) every 100 ms from the kill until
/// the store answers; every failure must be a Redis error (the engine's `503`).
async fn claim_until_answered(store: &RedisStore, key: &str, killed_at: Instant) -> Window {
    let mut errors = Vec::new();
    loop {
        match store
            .claim(&claim_request(key, FencingToken::random()))
            .await
        {
            Ok(answer) => {
                return Window {
                    errors,
                    answered_after: killed_at.elapsed(),
                    outcome: answer.outcome,
                };
            }
            Err(StoreError::Redis(e)) => errors.push(e.to_string()),
            Err(other) => panic!("a failover must be a Redis error, not {other:?}"),
        }
        assert!(
            killed_at.elapsed() < FAILOVER_DEADLINE,
            "no answer {FAILOVER_DEADLINE:?} after the kill; errors: {errors:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(super) async fn a_killed_primary_keeps_replicated_records_and_loses_unreplicated_ones() {
    let _cluster = OwnCluster::start().await;
    let store = RedisStore::builder()
        .key_prefix("idem-failover")
        .connect(URL)
        .await
        .expect("connect to the failover cluster");
    let primaries = primaries_of("redis://127.0.0.1:7100/");
    assert_eq!(primaries.len(), 3, "{primaries:?}");

    // 1. A completed record that reached the replica survives its primary's death.
    let token = FencingToken::random();
    must_claim(&store, &claim_request("kept", token)).await;
    assert!(
        store
            .complete("acct_alice", "kept", token, &stored(b"kept"))
            .await
            .unwrap()
    );
    let kept_key = store.record_key("acct_alice", "kept");
    let owner = owner_of(&primaries, &kept_key).await;
    let replica = replica_of(&owner).await;
    // Replication is one ordered stream per primary: once the replica acknowledges a
    // later write to the same slot, it has the completion too.
    let mut owner_conn = node(&owner).await;
    let () = redis::cmd("SET")
        .arg(format!("{kept_key}:replicated"))
        .arg(1)
        .arg("PX")
        .arg(60_000)
        .query_async(&mut owner_conn)
        .await
        .unwrap();
    // Short WAITs, each within the connection's response timeout.
    let mut acked = 0_i64;
    for _ in 0..20 {
        acked = redis::cmd("WAIT")
            .arg(1)
            .arg(200)
            .query_async(&mut owner_conn)
            .await
            .unwrap();
        if acked == 1 {
            break;
        }
    }
    assert_eq!(acked, 1, "the replica acknowledged the completion");
    // A record on another primary, for what the rest of the cluster does meanwhile.
    let mut elsewhere = 0;
    while owner_of(
        &primaries,
        &store.record_key("acct_alice", &format!("o-{elsewhere}")),
    )
    .await
        == owner
    {
        elsewhere += 1;
    }
    let token = FencingToken::random();
    must_claim(&store, &claim_request(&format!("o-{elsewhere}"), token)).await;

    let runs = Arc::new(AtomicU32::new(0));
    let app = app(store.clone(), Arc::clone(&runs));

    kill(&pid_of(&owner).await);
    let killed_at = Instant::now();
    // The other primaries answer at once.
    let other = store
        .claim(&claim_request(
            &format!("o-{elsewhere}"),
            FencingToken::random(),
        ))
        .await
        .expect("a record on a live primary answers during the failover");
    assert!(matches!(other.outcome, ClaimOutcome::InProgress { .. }));
    let other_after = killed_at.elapsed();
    // Through the engine, well inside the node timeout (no promotion can have begun):
    // fresh keys spread over the slots, so some land on the dead primary. Those get
    // `503` problem+json without their handler running; the others run once each.
    let answers = futures_util::future::join_all((0..30).map(|i| {
        let app = &app;
        async move { pay(app, &format!("http-{i}")).await }
    }))
    .await;
    let http_after = killed_at.elapsed();
    let created = answers
        .iter()
        .filter(|(status, _)| *status == StatusCode::CREATED)
        .count();
    let unavailable: Vec<&(StatusCode, String)> = answers
        .iter()
        .filter(|(status, _)| *status == StatusCode::SERVICE_UNAVAILABLE)
        .collect();
    assert_eq!(created + unavailable.len(), answers.len(), "{answers:?}");
    assert!(
        !unavailable.is_empty(),
        "a key on the dead primary: {answers:?}"
    );
    assert!(created > 0, "keys on the live primaries: {answers:?}");
    assert!(
        unavailable
            .iter()
            .all(|(_, content_type)| content_type == "application/problem+json"),
        "{unavailable:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst) as usize, created);
    let window = claim_until_answered(&store, "kept", killed_at).await;
    assert_eq!(window.outcome, ClaimOutcome::Replay(stored(b"kept")));
    eprintln!(
        "failover 1 (replicated completion): killed {owner}, replica {replica}; \
         a record on another primary answered after {other_after:?}; 30 HTTP requests with \
         fresh keys by {http_after:?}: {created} created, {} 503 problem+json; the killed \
         primary's record answered (replay) after {:?} with {} error(s) before: {:?}",
        unavailable.len(),
        window.answered_after,
        window.errors.len(),
        window.errors.first()
    );

    // 2. A completion the replica never received is gone after the failover: its retry
    //    claims the key afresh, so the handler runs again. The primary's replication link
    //    is cut (a password the replica does not know, then its connection killed), which
    //    is what an unlucky kill between the reply and the replication does.
    let primaries = primaries_of(&replica);
    // Any primary but the promoted replica, which has no replica of its own now.
    let victim = primaries
        .iter()
        .find(|p| **p != replica)
        .expect("a primary with a replica")
        .clone();
    let victim_replica = replica_of(&victim).await;
    let mut lost = 0;
    while owner_of(
        &primaries,
        &store.record_key("acct_alice", &format!("lost-{lost}")),
    )
    .await
        != victim
    {
        lost += 1;
    }
    let lost_key = format!("lost-{lost}");
    let victim_pid = pid_of(&victim).await;
    let mut victim_conn = node(&victim).await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("replicas-cannot-reconnect")
        .query_async(&mut victim_conn)
        .await
        .unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut victim_conn)
        .await
        .unwrap();
    let token = FencingToken::random();
    must_claim(&store, &claim_request(&lost_key, token)).await;
    assert!(
        store
            .complete("acct_alice", &lost_key, token, &stored(b"lost"))
            .await
            .unwrap(),
        "the primary acknowledged the completion"
    );
    let mut replica_conn = node(&victim_replica).await;
    let () = redis::cmd("READONLY")
        .query_async(&mut replica_conn)
        .await
        .unwrap();
    let on_replica: i64 = redis::cmd("EXISTS")
        .arg(store.record_key("acct_alice", &lost_key))
        .query_async(&mut replica_conn)
        .await
        .unwrap();
    assert_eq!(on_replica, 0, "the replica never received the record");
    kill(&victim_pid);
    let killed_at = Instant::now();
    let window = claim_until_answered(&store, &lost_key, killed_at).await;
    assert!(
        matches!(window.outcome, ClaimOutcome::Claimed { takeover: None, .. }),
        "an acknowledged completion lost with its primary: the retry claims afresh, got {:?}",
        window.outcome
    );
    eprintln!(
        "failover 2 (unreplicated completion): killed {victim}, replica {victim_replica}; \
         the retry was answered after {:?} with {} error(s) before ({:?}): Claimed, the \
         completed record is gone",
        window.answered_after,
        window.errors.len(),
        window.errors.first()
    );
}
