//! `#[idempotent(key = …, scope = …)]` on plain async functions (consumer functions),
//! through the public API: calling one runs its body once per key and payload, every
//! duplicate gets the typed output back, on the memory store and on SQLite (a real file),
//! on a multi-thread runtime.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idempotent_runtime::engine::{Failure, Refused};
use idempotent_runtime::store::{MemoryStore, SqliteStore};
use idempotent_runtime::{Idempotency, IdempotencyKey, Outcome, Sqlite, Tx, idempotent};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// The message a consumer gets.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    id: String,
    cents: u64,
}

fn order(id: &str, cents: u64) -> Order {
    Order {
        id: id.to_owned(),
        cents,
    }
}

/// What the function returns: recorded as JSON, replayed typed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    charge: String,
    cents: u64,
    run: usize,
}

/// What the test controls the body with: not part of the payload (not `Serialize`).
#[derive(Clone)]
struct Probe {
    /// How many times the body ran.
    runs: Arc<AtomicUsize>,
    /// The body waits for this to be `true` before returning, so that duplicates arrive
    /// while it runs (a channel, not a one-shot wake-up: should the body run more than
    /// once, every run is released and the test fails on the count instead of hanging).
    release: Arc<watch::Sender<bool>>,
    /// Whether the body waits at all.
    hold: bool,
}

impl Probe {
    fn new(hold: bool) -> Self {
        Self {
            runs: Arc::default(),
            release: Arc::new(watch::Sender::new(false)),
            hold,
        }
    }
}

/// A transient failure: `Err` is not recorded (and need not be serialisable).
#[derive(Debug)]
struct GatewayDown;

#[idempotent(key = order.id, scope = "orders", payload = order, wait = "60s")]
async fn charge(
    idempotency: &Idempotency,
    order: Order,
    probe: Probe,
    key: IdempotencyKey,
) -> Result<Receipt, GatewayDown> {
    let run = probe.runs.fetch_add(1, Ordering::SeqCst) + 1;
    if probe.hold {
        let mut released = probe.release.subscribe();
        let _ = released.wait_for(|open| *open).await;
    }
    if order.cents == 0 {
        return Err(GatewayDown);
    }
    Ok(Receipt {
        charge: format!("ch_{}", key.derive("gateway")),
        cents: order.cents,
        run,
    })
}

async fn memory() -> (Idempotency, Option<tempfile::TempDir>) {
    (Idempotency::new(MemoryStore::new()), None)
}

async fn sqlite() -> (Idempotency, Option<tempfile::TempDir>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idempotency.db");
    let store = SqliteStore::connect(path.to_str().expect("a utf-8 path"))
        .await
        .expect("open the SQLite store");
    (Idempotency::new(store), Some(dir))
}

/// 32 calls of one message at once, on 4 threads, while the first holds its claim: the
/// body runs once, and every call gets its typed output (the duplicates wait for it,
/// `wait = "60s"`, and get it replayed).
async fn thirty_two_concurrent_calls_run_the_body_once(
    (engine, _dir): (Idempotency, Option<tempfile::TempDir>),
) {
    let probe = Probe::new(true);
    let started = Arc::new(AtomicUsize::new(0));
    let calls: Vec<_> = (0..32)
        .map(|_| {
            let (engine, probe, started) = (engine.clone(), probe.clone(), started.clone());
            tokio::spawn(async move {
                started.fetch_add(1, Ordering::SeqCst);
                charge(&engine, order("o_1", 1999), probe).await
            })
        })
        .collect();
    // Released once every call has started and the body runs: the other 31 meet a
    // running claim (or its record), never an empty key.
    while started.load(Ordering::SeqCst) < 32 || probe.runs.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    probe.release.send_replace(true);
    let (mut ran, mut replayed) = (Vec::new(), Vec::new());
    for call in calls {
        match call.await.expect("the call") {
            Outcome::Ran(receipt) => ran.push(receipt),
            Outcome::Replayed(receipt) => replayed.push(receipt),
            other => panic!("every call settles with the output: {other:?}"),
        }
    }
    assert_eq!(
        probe.runs.load(Ordering::SeqCst),
        1,
        "the body ran more than once"
    );
    assert_eq!((ran.len(), replayed.len()), (1, 31));
    assert_eq!(ran[0].run, 1);
    assert!(replayed.iter().all(|receipt| *receipt == ran[0]));
}

/// A later call replays the typed output; the same id with another payload runs nothing.
async fn replays_then_refuses_another_payload(
    (engine, _dir): (Idempotency, Option<tempfile::TempDir>),
) {
    let probe = Probe::new(false);
    let Outcome::Ran(first) = charge(&engine, order("o_2", 500), probe.clone()).await else {
        panic!("the first call runs");
    };
    let Outcome::Replayed(again) = charge(&engine, order("o_2", 500), probe.clone()).await else {
        panic!("the second call replays");
    };
    assert_eq!(first, again);
    assert!(first.charge.starts_with("ch_"), "{first:?}");
    let reused = charge(&engine, order("o_2", 700), probe.clone()).await;
    assert!(matches!(reused, Outcome::KeyReused), "{reused:?}");
    // Another id is another message.
    let other = charge(&engine, order("o_3", 700), probe.clone()).await;
    assert!(
        matches!(
            other,
            Outcome::Ran(Receipt {
                cents: 700,
                run: 2,
                ..
            })
        ),
        "{other:?}"
    );
    assert_eq!(probe.runs.load(Ordering::SeqCst), 2);
}

/// `Err` releases the key: the next call with the same message runs the body again.
async fn an_error_releases_the_key((engine, _dir): (Idempotency, Option<tempfile::TempDir>)) {
    let probe = Probe::new(false);
    let failed = charge(&engine, order("o_4", 0), probe.clone()).await;
    assert!(
        matches!(failed, Outcome::Failed(Failure::Error(GatewayDown))),
        "{failed:?}"
    );
    let again = charge(&engine, order("o_4", 0), probe.clone()).await;
    assert!(
        matches!(again, Outcome::Failed(Failure::Error(GatewayDown))),
        "{again:?}"
    );
    assert_eq!(
        probe.runs.load(Ordering::SeqCst),
        2,
        "a failure is not recorded"
    );
}

macro_rules! on_every_store {
    ($($check:ident),+ $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $check() {
                    super::$check(super::memory().await).await
                }
            )+
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $check() {
                    super::$check(super::sqlite().await).await
                }
            )+
        }
    };
}

on_every_store!(
    thirty_two_concurrent_calls_run_the_body_once,
    replays_then_refuses_another_payload,
    an_error_releases_the_key,
);

/// An application's state holding the engine: `engine = app.idempotency`.
#[derive(Clone)]
struct App {
    idempotency: Idempotency,
    tenant: String,
}

/// The engine and the scope from an argument, the key from a method, and the one
/// value argument besides the app as the payload by name.
#[idempotent(engine = app.idempotency, scope = app.tenant, key = command.key(), payload = command)]
async fn rename(app: App, command: Rename, key: IdempotencyKey) -> Result<String, String> {
    Ok(format!(
        "{} renamed to {} under {key}",
        app.tenant, command.name
    ))
}

#[derive(Debug, Serialize)]
struct Rename {
    id: u64,
    name: String,
}

impl Rename {
    fn key(&self) -> String {
        format!("rename-{}", self.id)
    }
}

#[tokio::test]
async fn the_engine_scope_and_key_can_come_from_expressions() {
    let app = App {
        idempotency: Idempotency::new(MemoryStore::new()),
        tenant: "acme".to_owned(),
    };
    let command = || Rename {
        id: 7,
        name: "tea".to_owned(),
    };
    let first = rename(app.clone(), command()).await;
    assert!(
        matches!(&first, Outcome::Ran(text) if text == "acme renamed to tea under rename-7"),
        "{first:?}"
    );
    let again = rename(app.clone(), command()).await;
    assert!(
        matches!(again, Outcome::Replayed(text) if text == "acme renamed to tea under rename-7")
    );
    // Another tenant is another key space: the same id runs there.
    let other = App {
        tenant: "globex".to_owned(),
        ..app.clone()
    };
    assert!(matches!(rename(other, command()).await, Outcome::Ran(_)));
}

/// The inbox: a `&mut Tx<Sqlite>` argument makes the body's writes commit with the
/// record; the message's one value argument is the payload.
#[idempotent(key = entry.message, scope = "ledger")]
async fn book(
    idempotency: &Idempotency,
    entry: Entry,
    tx: &mut Tx<Sqlite>,
) -> Result<i64, sqlx::Error> {
    sqlx::query("INSERT INTO ledger (message, cents) VALUES (?, ?)")
        .bind(&entry.message)
        .bind(entry.cents)
        .execute(tx.conn())
        .await?;
    Ok(entry.cents)
}

#[derive(Debug, Clone, Serialize)]
struct Entry {
    message: String,
    cents: i64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transactional_function_writes_its_row_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.db");
    let store = SqliteStore::connect(path.to_str().expect("a utf-8 path"))
        .await
        .expect("open the SQLite store");
    sqlx::query("CREATE TABLE ledger (message TEXT NOT NULL, cents INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .expect("create the ledger");
    let pool = store.pool().clone();
    let engine = Idempotency::new(store);
    let entry = Entry {
        message: "m_1".to_owned(),
        cents: 1999,
    };
    let first = book(&engine, entry.clone()).await;
    assert!(matches!(first, Outcome::Ran(1999)), "{first:?}");
    let again = book(&engine, entry).await;
    assert!(matches!(again, Outcome::Replayed(1999)), "{again:?}");
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ledger")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(rows, 1, "the row is written once");
}

/// A payload whose JSON cannot be written (a map with keys that are not strings) has no
/// fingerprint: the call is refused and the body does not run, rather than run under a
/// key it could not tell duplicates of apart by.
#[idempotent(key = batch.id, scope = "batches", payload = batch)]
async fn tally(idempotency: &Idempotency, batch: Batch, probe: Probe) -> Result<usize, String> {
    probe.runs.fetch_add(1, Ordering::SeqCst);
    Ok(batch.counts.len())
}

#[derive(Debug, Serialize)]
struct Batch {
    id: u64,
    counts: std::collections::HashMap<(u8, u8), u32>,
}

#[tokio::test]
async fn a_payload_that_does_not_serialise_runs_nothing() {
    let engine = Idempotency::new(MemoryStore::new());
    let probe = Probe::new(false);
    let batch = Batch {
        id: 1,
        counts: [((1, 2), 3)].into(),
    };
    let refused = tally(&engine, batch, probe.clone()).await;
    assert!(
        matches!(&refused, Outcome::Refused(Refused::PayloadUnserialisable(why)) if why.contains("key must be a string")),
        "{refused:?}"
    );
    assert_eq!(probe.runs.load(Ordering::SeqCst), 0);
    // With string keys the same function runs.
    let fine = Batch {
        id: 2,
        counts: std::collections::HashMap::new(),
    };
    assert!(matches!(
        tally(&engine, fine, probe.clone()).await,
        Outcome::Ran(0)
    ));
    assert_eq!(probe.runs.load(Ordering::SeqCst), 1);
}
