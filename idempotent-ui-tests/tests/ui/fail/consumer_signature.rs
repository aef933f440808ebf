//! What a consumer function must look like, each mistake refused on its token.

use idempotent_runtime::{Idempotency, IdempotencyKey, idempotent};
use serde::Serialize;

#[derive(Serialize)]
struct Order {
    id: String,
}

#[idempotent(key = order.id, scope = "orders")]
fn not_async(idempotency: &Idempotency, order: Order) -> Result<u64, String> {
    let _ = order.id;
    Ok(1)
}

#[idempotent(key = order.id, scope = "orders")]
async fn not_a_result(idempotency: &Idempotency, order: Order) -> u64 {
    order.id.len() as u64
}

type Fallible<T> = Result<T, String>;

#[idempotent(key = order.id, scope = "orders")]
async fn alias(idempotency: &Idempotency, order: Order) -> std::io::Result<u64> {
    let _ = order.id;
    Ok(1)
}

#[idempotent(key = order.id, scope = "orders")]
async fn alias_without_result(idempotency: &Idempotency, order: Order) -> Fallible<u64> {
    let _ = order.id;
    Ok(1)
}

#[idempotent(key = order.id)]
async fn no_scope(idempotency: &Idempotency, order: Order) -> Result<u64, String> {
    let _ = order.id;
    Ok(1)
}

#[idempotent(key = ordr.id, scope = "orders")]
async fn typo(idempotency: &Idempotency, order: Order) -> Result<u64, String> {
    let _ = order.id;
    Ok(1)
}

#[idempotent(key = key, scope = "orders")]
async fn the_claimed_key(idempotency: &Idempotency, order: Order, key: IdempotencyKey) -> Result<u64, String> {
    let _ = (order.id, key);
    Ok(1)
}

#[idempotent(key = "order", scope = "orders")]
async fn constant_key(idempotency: &Idempotency, order: Order) -> Result<u64, String> {
    let _ = order.id;
    Ok(1)
}

#[idempotent(key = order.id, scope = "orders")]
async fn borrowed(idempotency: &Idempotency, order: &Order) -> Result<u64, String> {
    let _ = &order.id;
    Ok(1)
}

#[idempotent(key = id, scope = "orders")]
async fn destructured(idempotency: &Idempotency, Order { id }: Order) -> Result<u64, String> {
    let _ = id;
    Ok(1)
}

#[idempotent(key = order.id, scope = "orders")]
async fn no_engine(order: Order) -> Result<u64, String> {
    let _ = order.id;
    Ok(1)
}

#[idempotent(key = order.id, scope = "orders")]
async fn two_values(idempotency: &Idempotency, order: Order, attempt: u32) -> Result<u64, String> {
    let _ = (order.id, attempt);
    Ok(1)
}

#[idempotent(key = order.id, scope = "orders", fingerprint = "json")]
async fn handler_argument(idempotency: &Idempotency, order: Order) -> Result<u64, String> {
    let _ = order.id;
    Ok(1)
}

#[idempotent(key = order.id, scope = "orders")]
async fn engine_in_body(idempotency: &Idempotency, order: Order) -> Result<u64, String> {
    let _ = (order.id, idempotency.header_name());
    Ok(1)
}

fn main() {}
