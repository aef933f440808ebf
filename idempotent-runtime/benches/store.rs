//! The stores alone, without the engine: claim + complete of a fresh key (the write path
//! of every first request) and the replay of a completed key (every retry), on
//! `MemoryStore`, `SqliteStore` (a WAL file in a temporary directory) and, when
//! `IDEMPOTENT_TEST_POSTGRES_URL` is set, `PostgresStore` (two round trips for a fresh
//! key, one for a replay). Also claim + complete of 64 fresh keys at once, as under
//! load.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::store::{ClaimOutcome, ClaimRequest, FencingToken, StoredResponse};
use idempotent_runtime::{Fingerprint, Store};
use tokio::runtime::Runtime;

/// Requests in flight at once in the concurrent benchmark (the HTTP benchmark's wrk
/// connections).
const CONCURRENT: usize = 64;

const FINGERPRINT: Fingerprint = Fingerprint {
    version: 1,
    digest: [7; 32],
};

fn response() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![
            ("content-type".to_owned(), b"application/json".to_vec()),
            ("location".to_owned(), b"/payments/pay_123".to_vec()),
        ],
        body: Some(Bytes::from_static(
            br#"{"id":"pay_123","amount":10000,"currency":"BRL","status":"succeeded"}"#,
        )),
    }
}

fn request(key: &str, token: FencingToken) -> ClaimRequest<'_> {
    ClaimRequest {
        scope: "acct_bench",
        key,
        fingerprint: &FINGERPRINT,
        ttl: Duration::from_secs(24 * 3600),
        lease: Duration::from_secs(30),
        token,
    }
}

fn bench_store(c: &mut Criterion, runtime: &Runtime, name: &str, store: Arc<dyn Store>) {
    let stored = response();
    let next_key = AtomicU64::new(0);
    c.bench_function(&format!("store/{name}/claim_complete_fresh_key"), |b| {
        b.to_async(runtime).iter(|| {
            let key = format!("k{}", next_key.fetch_add(1, Ordering::Relaxed));
            let store = Arc::clone(&store);
            let stored = &stored;
            async move {
                let token = FencingToken::random();
                let outcome = store
                    .claim(&request(&key, token))
                    .await
                    .expect("claim")
                    .outcome;
                assert_eq!(
                    outcome,
                    ClaimOutcome::Claimed {
                        token,
                        takeover: None,
                        steps: Vec::new(),
                    }
                );
                let done = store
                    .complete("acct_bench", &key, token, stored)
                    .await
                    .expect("complete");
                assert!(done);
            }
        })
    });

    // Many requests at once, as under load: what SQLite's group commit batches.
    let mut group = c.benchmark_group(format!("store/{name}"));
    group.throughput(Throughput::Elements(CONCURRENT as u64));
    group.bench_function(format!("claim_complete_{CONCURRENT}_concurrent"), |b| {
        b.to_async(runtime).iter(|| {
            let keys: Vec<String> = (0..CONCURRENT)
                .map(|_| format!("c{}", next_key.fetch_add(1, Ordering::Relaxed)))
                .collect();
            let store = Arc::clone(&store);
            let stored = stored.clone();
            async move {
                let tasks: Vec<_> = keys
                    .into_iter()
                    .map(|key| {
                        let store = Arc::clone(&store);
                        let stored = stored.clone();
                        tokio::spawn(async move {
                            let token = FencingToken::random();
                            let outcome = store
                                .claim(&request(&key, token))
                                .await
                                .expect("claim")
                                .outcome;
                            assert!(matches!(outcome, ClaimOutcome::Claimed { .. }));
                            let done = store
                                .complete("acct_bench", &key, token, &stored)
                                .await
                                .expect("complete");
                            assert!(done);
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await.expect("task");
                }
            }
        })
    });
    group.finish();

    runtime.block_on(async {
        let token = FencingToken::random();
        store
            .claim(&request("replayed", token))
            .await
            .expect("claim");
        assert!(
            store
                .complete("acct_bench", "replayed", token, &stored)
                .await
                .expect("complete")
        );
    });
    c.bench_function(&format!("store/{name}/replay"), |b| {
        b.to_async(runtime).iter(|| {
            let store = Arc::clone(&store);
            async move {
                let outcome = store
                    .claim(&request("replayed", FencingToken::random()))
                    .await
                    .expect("claim")
                    .outcome;
                assert!(matches!(outcome, ClaimOutcome::Replay(_)));
                black_box(outcome)
            }
        })
    });
}

fn stores(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    bench_store(c, &runtime, "memory", Arc::new(MemoryStore::new()));

    #[cfg(feature = "sqlite")]
    {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bench.db");
        let store = runtime
            .block_on(idempotent_runtime::store::SqliteStore::connect(
                path.to_str().expect("utf-8 path"),
            ))
            .expect("open sqlite store");
        bench_store(c, &runtime, "sqlite", Arc::new(store));
    }

    #[cfg(feature = "postgres")]
    postgres(c, &runtime);
}

/// Postgres, when `IDEMPOTENT_TEST_POSTGRES_URL` is set: in a fresh schema, dropped
/// afterwards.
#[cfg(feature = "postgres")]
fn postgres(c: &mut Criterion, runtime: &Runtime) {
    const URL_VAR: &str = "IDEMPOTENT_TEST_POSTGRES_URL";
    let Ok(url) = std::env::var(URL_VAR) else {
        eprintln!("skipped store/postgres: {URL_VAR} is not set");
        return;
    };
    let schema = format!("idem_bench_{:016x}", rand::random::<u64>());
    let store = runtime
        .block_on(idempotent_runtime::store::PostgresStore::connect_in_schema(
            &url, &schema,
        ))
        .expect("open postgres store");
    let pool = store.pool().clone();
    bench_store(c, runtime, "postgres", Arc::new(store));
    runtime.block_on(async {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
        )))
        .execute(&pool)
        .await
        .expect("drop the benchmark schema");
    });
}

criterion_group!(benches, stores);
criterion_main!(benches);
