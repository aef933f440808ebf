//! The floor: the least work any correct in-process idempotency layer does for this
//! handler, written by hand, so that the memory store's rows can be read against what is
//! possible at all and not only against the bare handler.
//!
//! Per request it does what the contract cannot do without: read the key, buffer the
//! body, fingerprint method, path and body with SHA-256, run the body's extractor (before
//! the claim, as the contract orders: a body it refuses claims nothing), and look the key
//! up in a mutex-guarded map, once. A fresh key is claimed in that map (an atomic claim: one
//! execution per concurrent duplicates), the handler runs, and the status, the
//! `Content-Type` and the body are kept for the key's replays (appended to the shard's
//! blocks, as `MemoryStore` keeps a record's bytes in its arena: a record allocates nothing
//! of its own, which under glibc is most of what keeping it costs); a replay
//! answers them with `Idempotent-Replayed: true`, a duplicate of a running key `409`, a
//! key reused with another body `422`.
//!
//! Everything else the engine does is left out on purpose: TTLs and leases (records
//! never expire here), fencing tokens, the renewal heartbeat, surviving a client that
//! hangs up, stored-body caps and deadlines, `Retry-After`, metrics, tracing, the
//! published policy. So no layer that keeps the contract can beat this one: it is the
//! ceiling, not a peer.

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Router, extract::FromRef};
use hashbrown::HashTable;
use sha2::{Digest, Sha256};

use crate::order::{self, Caller, Counters, Order};

/// How many independently locked tables hold the records, as in `MemoryStore`.
const SHARDS: usize = 32;
/// The size of the blocks a shard appends its records' bytes to, as `MemoryStore`'s
/// arena settles on.
const BLOCK: usize = 64 * 1024;

/// A key's record: claimed (the handler runs) or completed (its answer, for replays).
/// Its id and its answer's bytes are in its shard's blocks, as `MemoryStore` keeps them:
/// a record allocates nothing of its own (records never leave here, so no block is freed).
struct Record {
    hash: u64,
    fingerprint: [u8; 32],
    /// The scope, then the key.
    id: Span,
    scope_len: usize,
    /// Completed: the status; where its `Content-Type` then its body are; how long the
    /// `Content-Type` is.
    done: Option<(StatusCode, Span, usize)>,
}

/// Where bytes are in a shard's blocks.
#[derive(Clone, Copy)]
struct Span {
    block: usize,
    start: usize,
    len: usize,
}

/// One independently locked table of records, and the blocks holding their bytes.
#[derive(Default)]
struct Shard {
    table: HashTable<Record>,
    blocks: Vec<Vec<u8>>,
}

/// Appends `parts` to the last block (a new one when it is full); where they went.
fn push(blocks: &mut Vec<Vec<u8>>, parts: &[&[u8]]) -> Span {
    let len = parts.iter().map(|part| part.len()).sum();
    if blocks
        .last()
        .is_none_or(|block| block.capacity() - block.len() < len)
    {
        blocks.push(Vec::with_capacity(BLOCK.max(len)));
    }
    let block = blocks.len() - 1;
    let bytes = &mut blocks[block];
    let start = bytes.len();
    for part in parts {
        bytes.extend_from_slice(part);
    }
    Span { block, start, len }
}

fn bytes_at(blocks: &[Vec<u8>], span: Span) -> &[u8] {
    &blocks[span.block][span.start..span.start + span.len]
}

/// Whether `record` is the record of `(scope, key)`.
fn is(blocks: &[Vec<u8>], record: &Record, scope: &str, key: &str) -> bool {
    if record.scope_len != scope.len() || record.id.len != scope.len() + key.len() {
        return false;
    }
    let (stored_scope, stored_key) = bytes_at(blocks, record.id).split_at(scope.len());
    stored_scope == scope.as_bytes() && stored_key == key.as_bytes()
}

/// The records, by `(scope, key)`.
#[derive(Clone)]
struct Records {
    shards: Arc<[Mutex<Shard>]>,
    hasher: std::hash::RandomState,
}

impl Records {
    fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: std::hash::RandomState::new(),
        }
    }

    fn hash(&self, scope: &str, key: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, (scope, key))
    }

    fn shard(&self, hash: u64) -> &Mutex<Shard> {
        &self.shards[(hash >> 32) as usize % SHARDS]
    }
}

#[derive(Clone)]
struct AppState {
    records: Records,
    counters: Counters,
}

impl FromRef<AppState> for Counters {
    fn from_ref(state: &AppState) -> Self {
        state.counters.clone()
    }
}

/// The router with the floor layer on both order routes.
pub fn router(counters: Counters) -> Router {
    let state = AppState {
        records: Records::new(),
        counters,
    };
    Router::new()
        .route("/orders", post(create_order))
        .route("/orders/slow", post(create_slow_order))
        .route("/stats", get(order::stats))
        .with_state(state)
}

/// `fingerprint-only`: [`read_and_fingerprint`] and the handler, nothing claimed or kept.
/// No idempotency at all (every duplicate runs): it measures what the fingerprint the
/// contract requires costs before any store is touched, the floor's floor.
pub fn fingerprint_router(counters: Counters) -> Router {
    Router::new()
        .route("/orders", post(fingerprint_only_order))
        .route("/orders/slow", post(fingerprint_only_slow_order))
        .route("/stats", get(order::stats))
        .with_state(counters)
}

async fn fingerprint_only_order(
    State(counters): State<Counters>,
    caller: Caller,
    request: Request,
) -> Response {
    fingerprint_only(counters, caller, request, order::create_order).await
}

async fn fingerprint_only_slow_order(
    State(counters): State<Counters>,
    caller: Caller,
    request: Request,
) -> Response {
    fingerprint_only(counters, caller, request, order::create_slow_order).await
}

/// An order handler as `order.rs` writes them (`create_order`, `create_slow_order`): what
/// the floor and fingerprint-only call after their own reading of the request.
trait OrderHandler:
    AsyncFnOnce(Caller, State<Counters>, Json<Order>) -> (StatusCode, Json<order::Receipt>)
{
}

impl<F> OrderHandler for F where
    F: AsyncFnOnce(Caller, State<Counters>, Json<Order>) -> (StatusCode, Json<order::Receipt>)
{
}

/// [`read_and_fingerprint`], then `handler`: the fingerprint's cost and nothing else.
async fn fingerprint_only(
    counters: Counters,
    caller: Caller,
    request: Request,
    handler: impl OrderHandler,
) -> Response {
    match read_and_fingerprint(request).await {
        Ok((_, _, order)) => handler(caller, State(counters), Json(order))
            .await
            .into_response(),
        Err(answer) => answer,
    }
}

async fn create_order(State(state): State<AppState>, caller: Caller, request: Request) -> Response {
    idempotent(&state, caller, request, order::create_order).await
}

async fn create_slow_order(
    State(state): State<AppState>,
    caller: Caller,
    request: Request,
) -> Response {
    idempotent(&state, caller, request, order::create_slow_order).await
}

/// What the contract makes every layer do before it may claim: the key, the buffered body,
/// its SHA-256 fingerprint over method, path and body, and the body's extractor (a body
/// it refuses claims nothing). `Err` is the answer for a request that cannot be claimed.
async fn read_and_fingerprint(request: Request) -> Result<(String, [u8; 32], Order), Response> {
    let Some(key) = idempotency_key(request.headers()) else {
        return Err(StatusCode::BAD_REQUEST.into_response());
    };
    let (parts, body) = request.into_parts();
    // Within axum's default body limit, as the engine reads it.
    let Ok(body) = axum::body::to_bytes(body, 2 * 1024 * 1024).await else {
        return Err(StatusCode::BAD_REQUEST.into_response());
    };
    let mut sha = Sha256::new();
    sha.update(parts.method.as_str());
    sha.update([0]);
    sha.update(parts.uri.path());
    sha.update([0]);
    sha.update(&body);
    let fingerprint: [u8; 32] = sha.finalize().into();

    let request = Request::from_parts(parts, body.into());
    match Json::<Order>::from_request(request, &()).await {
        Ok(Json(order)) => Ok((key, fingerprint, order)),
        Err(rejection) => Err(rejection.into_response()),
    }
}

/// Claim, fingerprint, run `handler`, keep its answer — the floor of the contract.
async fn idempotent(
    state: &AppState,
    caller: Caller,
    request: Request,
    handler: impl OrderHandler,
) -> Response {
    let (key, fingerprint, order) = match read_and_fingerprint(request).await {
        Ok(read) => read,
        Err(answer) => return answer,
    };

    let scope = caller.account.as_str();
    let hash = state.records.hash(scope, &key);
    let shard = state.records.shard(hash);
    let id = {
        let mut shard = shard.lock().unwrap();
        let Shard { table, blocks } = &mut *shard;
        match table.find(hash, |r| is(blocks, r, scope, &key)) {
            Some(record) if record.fingerprint != fingerprint => {
                return StatusCode::UNPROCESSABLE_ENTITY.into_response();
            }
            Some(Record {
                done: Some((status, span, content_type_len)),
                ..
            }) => {
                let (content_type, body) = bytes_at(blocks, *span).split_at(*content_type_len);
                let mut response = (*status, Bytes::copy_from_slice(body)).into_response();
                if !content_type.is_empty()
                    && let Ok(content_type) = HeaderValue::from_bytes(content_type)
                {
                    response
                        .headers_mut()
                        .insert(header::CONTENT_TYPE, content_type);
                }
                response
                    .headers_mut()
                    .insert("idempotent-replayed", HeaderValue::from_static("true"));
                return response;
            }
            Some(_) => return StatusCode::CONFLICT.into_response(),
            None => {}
        }
        let id = push(blocks, &[scope.as_bytes(), key.as_bytes()]);
        let record = Record {
            hash,
            fingerprint,
            id,
            scope_len: scope.len(),
            done: None,
        };
        table.insert_unique(hash, record, |r| r.hash);
        id
    };

    let answer = handler(caller, State(state.counters.clone()), Json(order))
        .await
        .into_response();
    let (parts, body) = answer.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await;
    let mut shard = shard.lock().unwrap();
    let Shard { table, blocks } = &mut *shard;
    // The claim is this request's until it completes or is removed: found by its id's
    // place, which no other record shares.
    let Ok(mut entry) =
        table.find_entry(hash, |r| r.id.block == id.block && r.id.start == id.start)
    else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let Ok(body) = body else {
        entry.remove();
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .map_or(&b""[..], HeaderValue::as_bytes);
    let span = push(blocks, &[content_type, &body]);
    entry.get_mut().done = Some((parts.status, span, content_type.len()));
    drop(shard);
    Response::from_parts(parts, body.into())
}

/// The `Idempotency-Key` header, quotes stripped.
fn idempotency_key(headers: &HeaderMap) -> Option<String> {
    let value = headers.get("idempotency-key")?.to_str().ok()?;
    let key = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value);
    (!key.is_empty()).then(|| key.to_owned())
}
