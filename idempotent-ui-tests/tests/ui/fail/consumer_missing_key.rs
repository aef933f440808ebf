//! A consumer function without `key = …`: one error, on the attribute, naming the fix.

use idempotent_runtime::{Idempotency, idempotent};
use serde::Serialize;

#[derive(Serialize)]
struct Order {
    id: String,
}

#[idempotent(scope = "orders")]
async fn charge(idempotency: &Idempotency, order: Order) -> Result<u64, String> {
    let _ = order.id;
    Ok(1)
}

#[idempotent(scope = "orders", key = optional)]
async fn refund(idempotency: &Idempotency, order: Order) -> Result<u64, String> {
    let _ = order.id;
    Ok(1)
}

#[idempotent(payload = order)]
async fn ship(order: Order) -> Result<u64, String> {
    let _ = order.id;
    Ok(1)
}

fn main() {}
