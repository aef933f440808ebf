//! The whole engine per request (claim, spawned handler, heartbeat, record, replay) on
//! the memory store, with a trivial handler: the framework's own overhead.

use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use http::StatusCode;
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::{Fingerprint, HandlerConfig, Idempotency};

const CONFIG: HandlerConfig = HandlerConfig::new();

fn engine(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let engine = Idempotency::new(MemoryStore::new());
    let fingerprint = Fingerprint {
        version: 1,
        digest: [7; 32],
    };
    let next_key = AtomicU64::new(0);

    c.bench_function("engine/memory/fresh_key_201", |b| {
        b.to_async(&runtime).iter(|| {
            let key = format!("k{}", next_key.fetch_add(1, Ordering::Relaxed));
            let engine = engine.clone();
            async move {
                let response = engine
                    .run(&CONFIG, "bench", &key, fingerprint, |_| async {
                        (StatusCode::CREATED, "{\"id\":1}")
                    })
                    .await;
                assert_eq!(response.status(), StatusCode::CREATED);
            }
        })
    });

    runtime.block_on(
        engine.run(&CONFIG, "bench", "replayed", fingerprint, |_| async {
            (StatusCode::CREATED, "{\"id\":1}")
        }),
    );
    c.bench_function("engine/memory/replay", |b| {
        b.to_async(&runtime).iter(|| {
            let engine = engine.clone();
            async move {
                let response = engine
                    .run(&CONFIG, "bench", "replayed", fingerprint, |_| async {
                        StatusCode::IM_A_TEAPOT
                    })
                    .await;
                assert_eq!(response.status(), StatusCode::CREATED);
            }
        })
    });
}

criterion_group!(benches, engine);
criterion_main!(benches);
