//! Consumer functions: `key = …` over the arguments makes a plain `async fn` run once per
//! message id through the engine; calling it returns `Outcome<T, E>`.

use std::sync::Arc;

use idempotent_runtime::{Idempotency, IdempotencyKey, Outcome, Postgres, Tx, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize)]
struct Order {
    id: String,
    cents: u64,
}

#[derive(Serialize, Deserialize)]
struct Receipt {
    charge: String,
}

#[derive(Debug)]
struct GatewayDown;

/// The engine as an argument; the one value argument is the payload.
#[idempotent(key = order.id, scope = "orders", ttl = "24h", lease = "10s")]
async fn charge(
    idempotency: &Idempotency,
    order: Order,
    key: IdempotencyKey,
) -> Result<Receipt, GatewayDown> {
    let _ = order.cents;
    Ok(Receipt {
        charge: key.derive("gateway"),
    })
}

struct App {
    idempotency: Arc<Idempotency>,
}

/// The engine from an argument, a numeric key, an explicit payload, an owned engine
/// passed on to the body, `mut` arguments.
#[idempotent(engine = app.idempotency, key = id, scope = tenant, payload = (id, &lines))]
async fn import(
    app: App,
    tenant: String,
    id: u64,
    mut lines: Vec<String>,
) -> Result<usize, String> {
    let _ = (app.idempotency, tenant, id);
    lines.sort();
    Ok(lines.len())
}

/// The inbox: a transaction argument.
#[idempotent(key = order.id, scope = "ledger", policy = BOOK_POLICY)]
async fn book(
    idempotency: Idempotency,
    order: Order,
    tx: &mut Tx<Postgres>,
) -> Result<(), sqlx::Error> {
    let _ = idempotency.header_name();
    sqlx::query("INSERT INTO ledger (id) VALUES ($1)")
        .bind(order.id)
        .execute(tx.conn())
        .await
        .map(drop)
}

pub(crate) fn main() {
    // What the calls return, by type.
    fn outcome<T, E, F: Future<Output = Outcome<T, E>>>(_: F) {}
    let engine = Idempotency::new(idempotent_runtime::store::MemoryStore::new());
    let order = || Order {
        id: "o_1".into(),
        cents: 1,
    };
    outcome::<Receipt, GatewayDown, _>(charge(&engine, order()));
    let app = App {
        idempotency: Arc::new(engine.clone()),
    };
    outcome::<usize, String, _>(import(app, "acme".into(), 7, Vec::new()));
    outcome::<(), sqlx::Error, _>(book(engine, order()));
    let _ = BOOK_POLICY;
}
