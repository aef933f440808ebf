//! `PostgresStore` alone, without the engine: claim + complete of a fresh key (the write
//! path of every first request: two statements, two round trips) and the replay of a
//! completed key (every retry: one statement, one round trip). Same shapes and names as
//! `benches/store.rs`, so the numbers line up with the memory and SQLite stores.
//!
//! Needs `IDEMPOTENT_TEST_POSTGRES_URL`; without it the benchmarks are skipped. They work
//! in a fresh schema, dropped afterwards. Run with
//! `cargo bench -p idempotent-runtime --all-features --bench store_postgres`.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use idempotent_runtime::store::PostgresStore;
use idempotent_runtime::{
    ClaimOutcome, ClaimRequest, FencingToken, Fingerprint, Store, StoredResponse,
};
use sqlx::AssertSqlSafe;

const URL_VAR: &str = "IDEMPOTENT_TEST_POSTGRES_URL";

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

fn postgres(c: &mut Criterion) {
    let Ok(url) = std::env::var(URL_VAR) else {
        eprintln!("skipped: {URL_VAR} is not set");
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let schema = format!("idem_bench_{:016x}", rand::random::<u64>());
    let store = Arc::new(
        runtime
            .block_on(PostgresStore::connect_in_schema(&url, &schema))
            .expect("open postgres store"),
    );

    let stored = response();
    let next_key = AtomicU64::new(0);
    c.bench_function("store/postgres/claim_complete_fresh_key", |b| {
        b.to_async(&runtime).iter(|| {
            let key = format!("k{}", next_key.fetch_add(1, Ordering::Relaxed));
            let store = Arc::clone(&store);
            let stored = &stored;
            async move {
                let token = FencingToken::random();
                let outcome = store.try_claim(&request(&key, token)).await.expect("claim");
                assert_eq!(outcome, ClaimOutcome::Claimed { token });
                let done = store
                    .complete("acct_bench", &key, token, stored)
                    .await
                    .expect("complete");
                assert!(done);
            }
        })
    });

    runtime.block_on(async {
        let token = FencingToken::random();
        store
            .try_claim(&request("replayed", token))
            .await
            .expect("claim");
        assert!(
            store
                .complete("acct_bench", "replayed", token, &stored)
                .await
                .expect("complete")
        );
    });
    c.bench_function("store/postgres/replay", |b| {
        b.to_async(&runtime).iter(|| {
            let store = Arc::clone(&store);
            async move {
                let outcome = store
                    .try_claim(&request("replayed", FencingToken::random()))
                    .await
                    .expect("claim");
                assert!(matches!(outcome, ClaimOutcome::Replay(_)));
                black_box(outcome)
            }
        })
    });

    runtime.block_on(async {
        sqlx::query(AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
        )))
        .execute(store.pool())
        .await
        .expect("drop the benchmark schema");
    });
}

criterion_group!(benches, postgres);
criterion_main!(benches);
