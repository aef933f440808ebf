//! The typed entry point ([`Idempotency::once`]) on the store: the same protocol as an
//! HTTP request, driven through engines over the store under test, so a store whose
//! records keep HTTP answers keeps a function's typed output too.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Backend, KEY, SCOPE, setup};
use crate::config::HandlerConfig;
use crate::engine::{Failure, Idempotency, Outcome};
use crate::fingerprint::Fingerprint;
use crate::store::Store;

/// Duplicates wait for the original (polling, or the store's watch), so every call
/// settles with the output.
const CONFIG: HandlerConfig = HandlerConfig::new()
    .name("conformance_function")
    .wait(Duration::from_secs(20));

/// A typed output with nested data, so that the round trip through the store's bytes is
/// a real one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Settled {
    run: usize,
    ledger: Vec<(String, i64)>,
    note: Option<String>,
}

/// An engine over `store` without a replay cache: every replay is read from the store.
fn engine(store: Arc<dyn Store>) -> Idempotency {
    Idempotency::builder_shared(store)
        .replay_cache(None)
        .build()
}

async fn call(
    engine: &Idempotency,
    key: &str,
    payload: &[u8],
    runs: &Arc<AtomicUsize>,
    fail: bool,
) -> Outcome<Settled, String> {
    let runs = runs.clone();
    engine
        .once(
            &CONFIG,
            SCOPE,
            key,
            Fingerprint::of_payload(payload),
            move |_key| async move {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                if fail {
                    return Err(format!("run {run} failed"));
                }
                Ok(Settled {
                    run,
                    ledger: vec![("debit".to_owned(), -1999), ("credit".to_owned(), 1999)],
                    note: Some("ünïcode ✓".to_owned()),
                })
            },
        )
        .await
}

/// 32 concurrent calls with one key and payload through two engines over the store run
/// the function once; every other call gets its typed output back from the store; a
/// call with another payload is refused; a function's error releases the key, and the
/// next call runs it.
pub async fn check_function_runs_once_and_replays_its_output(backend: Backend) {
    let (_harness, store) = setup(backend).await;
    let engines = [engine(store.clone()), engine(store)];
    let runs = Arc::new(AtomicUsize::new(0));
    let calls: Vec<_> = (0..32)
        .map(|i| {
            let (engine, runs) = (engines[i % 2].clone(), runs.clone());
            tokio::spawn(async move { call(&engine, KEY, b"charge 1999", &runs, false).await })
        })
        .collect();
    let mut outputs = Vec::new();
    let mut ran = 0;
    for call in calls {
        match call.await.expect("a call") {
            Outcome::Ran(output) => {
                ran += 1;
                outputs.push(output);
            }
            Outcome::Replayed(output) => outputs.push(output),
            other => panic!("expected a run or a replay, got {other:?}"),
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the function ran more than once"
    );
    assert_eq!(ran, 1);
    assert!(
        outputs.iter().all(|output| *output == outputs[0]),
        "every duplicate gets the output of the one run: {outputs:?}"
    );
    assert_eq!(outputs[0].run, 1);
    let reused = call(&engines[1], KEY, b"charge 5", &runs, false).await;
    assert!(matches!(reused, Outcome::KeyReused), "{reused:?}");

    let failed = call(&engines[0], "other", b"charge 7", &runs, true).await;
    assert!(
        matches!(&failed, Outcome::Failed(Failure::Error(error)) if error == "run 2 failed"),
        "{failed:?}"
    );
    let retried = call(&engines[1], "other", b"charge 7", &runs, false).await;
    assert!(
        matches!(&retried, Outcome::Ran(output) if output.run == 3),
        "the error released the key: {retried:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}
