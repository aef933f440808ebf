//! Values of the wrong type in a consumer function's attribute and output: each reported
//! on the user's expression or type, with the fix.

use idempotent_runtime::{Idempotency, idempotent};
use serde::Serialize;

#[derive(Serialize)]
struct Order {
    id: String,
    lines: Vec<String>,
}

/// Not `Serialize`.
struct Raw {
    id: String,
}

/// Not `Deserialize`.
#[derive(Serialize)]
struct Receipt {
    charge: String,
}

#[idempotent(key = order.lines, scope = "orders")]
async fn key_not_text(idempotency: &Idempotency, order: Order) -> Result<u64, String> {
    let _ = order.id;
    Ok(1)
}

#[idempotent(key = raw.id, scope = "orders")]
async fn payload_not_serialize(idempotency: &Idempotency, raw: Raw) -> Result<u64, String> {
    let _ = raw.id;
    Ok(1)
}

#[idempotent(key = order.id, scope = "orders")]
async fn output_not_recordable(idempotency: &Idempotency, order: Order) -> Result<Receipt, String> {
    Ok(Receipt { charge: order.id })
}

#[idempotent(key = order.id, scope = "orders", engine = order.lines)]
async fn not_an_engine(order: Order) -> Result<u64, String> {
    let _ = order.id;
    Ok(1)
}

#[idempotent(key = order.idd, scope = "orders")]
async fn no_such_field(idempotency: &Idempotency, order: Order) -> Result<u64, String> {
    let _ = order.id;
    Ok(1)
}

fn main() {}
