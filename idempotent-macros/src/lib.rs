//! The `#[idempotent]` attribute macro. Use it through `idempotent-runtime`, which
//! re-exports it together with everything the expansion names.
//!
//! Layout: `args` parses the attribute's arguments, `signature` checks the
//! function, `expand` generates the wrapper; `consumer` checks and expands a consumer
//! function (`key = <expression>`). Durations (`"24h"`, `"1h 30m"`) are read with
//! `idempotent_policy::duration`, the grammar the runtime reads too.

mod args;
mod consumer;
mod expand;
mod signature;
#[cfg(test)]
mod tests;

use proc_macro::TokenStream;

/// Makes an Axum handler safe to retry with the `Idempotency-Key` header: the first
/// request with a key runs the handler and records its answer; a retry with the same key
/// and the same request gets the recorded answer (plus `Idempotent-Replayed: true`)
/// without running the handler again.
///
/// An example of each use, an Axum handler and a consumer function, is under Examples in
/// `idempotent_runtime`'s documentation of this attribute (`idempotent_runtime::idempotent`),
/// where they are compiled and run.
///
/// The handler stays an ordinary Axum handler for any router state `S` with
/// `Idempotency: FromRef<S>`.
///
/// # Arguments
///
/// - `scope = <argument>` (required): the argument naming the authenticated caller. It
///   must be bound to a plain name (`caller: Caller`, not `Caller(c): Caller`) and its type
///   must implement `Scope`. Keys are unique per scope.
/// - `state = AppState`: the router state. The attribute then checks that the state gives
///   the engine (`impl FromRef<AppState> for Idempotency`), and when it does not, the first
///   error is on this `AppState` and names the impl to write (see "The router state"
///   below). Optional: without it the handler works for any state that gives the engine.
/// - `ttl = "24h"`: how long a key is remembered. Durations are whole numbers with the
///   units `ms`, `s`, `m`, `h` and `d`, largest first, with or without spaces: `"500ms"`,
///   `"90s"`, `"15m"`, `"24h"`, `"7d"`, `"1h30m"`, `"1h 30m"` (the grammar of
///   `idempotent_runtime::duration`, which the runtime reads too); zero is refused.
///   Default: the engine's (24h unless configured).
/// - `lease = "30s"`: how long a running request keeps its claim between heartbeats; must
///   be shorter than `ttl`. Default: the engine's (30s unless configured).
/// - `max_duration = "2m"`: how long the handler and its response body may take. Past
///   it, the handler is interrupted and recorded as such (`500` `request_interrupted`,
///   replayed: it may have taken effect); a body still streaming is sent on but recorded
///   without its bytes; a transactional handler rolls back and its key is released.
///   Default: the engine's (5 minutes, `IdempotencyBuilder::default_max_duration`).
/// - `wait = "5s"`: a duplicate that finds the original still running waits up to this
///   long for its outcome and gets the replay, instead of `409` at once; if the original
///   is still running at the end, `409` + `Retry-After`; if it released its claim (a 5xx,
///   a panic), the waiter runs the handler itself. Refused when longer than a `max_duration`
///   written beside it; the engine cuts a wait longer than the handler's maximum duration
///   (its default included) to it. Default: the engine's (off,
///   `IdempotencyBuilder::default_wait`).
/// - `on_server_error = release | store`: `release` (default) frees the key after a 5xx so a
///   retry runs the handler again; `store` records and replays the 5xx. A transactional
///   handler (one taking `&mut Tx<DB>`) always rolls back and releases on a 5xx, so `store`
///   is refused there.
/// - `fingerprint = "raw" | "json"`: what makes a retry "the same request": the raw body
///   (default) or a canonical form of the JSON body.
/// - `exclude_headers = ["x-request-id"]`: response headers not to record and replay.
///   Every other end-to-end header is replayed as sent; `Set-Cookie`, `Date` and hop-by-hop
///   headers never are, and `Content-Length` is recomputed.
/// - `key = required | optional`: `required` (default) answers a request without an
///   `Idempotency-Key` header with `400`; `optional` (for rolling the header out) runs the
///   handler unprotected for such a request — nothing is claimed, stored or replayed, and
///   it is logged at debug with `event = "unprotected"`. A malformed key is `400` either
///   way, and a valid one is protected as usual. The handler's key argument is then
///   `key: Option<IdempotencyKey>` (`None` when it ran unprotected). Not for
///   transactional handlers.
/// - `policy = NAME`: also defines `const NAME: HandlerConfig`, with the handler's
///   visibility, holding the policy the handler runs with (the wrapper reads that very
///   constant). Name it to publish the policy, e.g. in OpenAPI with
///   `idempotent_runtime::openapi` (feature `utoipa`); TTL and lease left to the engine
///   are `None` there, and the engine fills them in.
/// - `crate = "path"`: where the runtime crate is, when it was renamed.
///
/// # Requirements
///
/// The function must be a non-generic `async fn` without `self`. Two arguments are not
/// extractors:
///
/// - `key: IdempotencyKey` receives the claimed key (e.g. to derive downstream keys);
///   under `key = optional` it is `key: Option<IdempotencyKey>`;
/// - `tx: &mut Tx<Sqlite>` / `&mut Tx<Postgres>` makes the handler transactional: its
///   writes through `tx.conn()` and the stored response commit together, and an `Err`, a
///   5xx or a panic rolls both back. Such a handler returns a `Result`.
///
/// The wrapper checks the `Idempotency-Key` header right after extracting the `scope`
/// argument: an unauthenticated request gets the authentication extractor's rejection
/// (e.g. 401) whether or not it has a key, and a missing or invalid key is answered with
/// 400 before the body is read and before the store is touched.
///
/// The key is taken by value, as `key: IdempotencyKey`: a borrowed key (`&IdempotencyKey`)
/// is refused, and so is an argument named `key` of a string type (`key: String` would be
/// the request body as text, Axum's `String` extractor; name it `body` if that is what
/// you want).
///
/// # Errors
///
/// Every mistake is a compile error on the offending token, and the only error: the
/// function is kept as written under the name `<name>_as_written` (its body is still
/// checked, and rust-analyzer keeps working), and its own name becomes a stub without
/// arguments, a handler for any router state, so `.route("/payments", post(name))`
/// compiles while the attribute is being fixed. One follow-on error remains: code that
/// calls the handler directly with its arguments (the stub has none).
///
/// # The router state
///
/// The router state must give the engine: `impl FromRef<AppState> for Idempotency`. The
/// macro does not know the router's state type unless told, and Axum reports a missing
/// impl as the handler not being a `Handler`: when `.route(.., post(name))` says the
/// handler does not implement ``Handler<(…), Idempotency>`` and `.with_state(state)` says
/// ``expected `Idempotency`, found `AppState` ``, the `FromRef` impl is missing (Rust
/// inferred the state to be `Idempotency`, the one type it knows gives an engine). With
/// `state = AppState` the first error says so, on `AppState`:
///
/// ```text
/// error[E0277]: `#[idempotent(state = AppState)]`: the router state `AppState` does not give the handler its engine
///    |
///    | #[idempotent(scope = caller, state = AppState)]
///    |                                      ^^^^^^^^ `Idempotency` does not implement `FromRef<AppState>`
/// ```
///
/// # On a consumer function
///
/// With a key expression, the attribute makes a plain `async fn` (a queue consumer's
/// function, a job) run once per message id: calling it runs the body through
/// `Idempotency::once`, and the declared `Result<T, E>` becomes `Outcome<T, E>`.
///
/// - `key = <expr>` (required): the message's id, an expression over the arguments whose
///   value implements `Display` (`key = order.id`, `key = msg.id()`, `key = id`). A key
///   expression is what makes a consumer function; a function that takes the engine and
///   has none is refused, with the fix. (`key = required | optional` stay a handler's.)
/// - `scope = <expr>` (required): the key space, `scope = "orders"` or an expression
///   (`scope = order.tenant`).
/// - `payload = <expr>`: what the key must keep meaning, fingerprinted by its canonical
///   JSON (`Serialize`); the same key with another payload is `Outcome::KeyReused`.
///   Default: the one argument besides the engine, the key and the transaction.
/// - `engine = <expr>`: the engine (`Idempotency`, `&Idempotency` or
///   `Arc<Idempotency>`), e.g. `engine = app.idempotency`. Default: the argument of type
///   `&Idempotency` (which the body does not get: it runs detached from the call) or
///   `Idempotency` (which it does).
/// - `ttl`, `lease`, `max_duration`, `wait`, `policy`, `crate` as above; a handler's
///   `state`, `on_server_error`, `fingerprint` and `exclude_headers` are refused.
///
/// Every argument is owned and bound to a plain name. `key: IdempotencyKey` gets the
/// claimed key; `tx: &mut Tx<DB>` runs the body in the transaction its record commits
/// in (`once_in_transaction`). `T` must be `Serialize + DeserializeOwned` (it is recorded
/// and replayed); `E` need not be (an `Err` is never recorded: it releases the key). On
/// an error, the function is kept as written, under its own name.
///
/// `#[axum::debug_handler]` goes below `#[idempotent]`, where it checks the expansion (the
/// handler Axum routes; give it `state = AppState` unless a `State<AppState>` argument
/// names the state). Above, it checks the function as written, whose key and transaction
/// arguments are no extractors, and refuses correct code.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(args.into(), item.into()).into()
}
