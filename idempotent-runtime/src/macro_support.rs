//! Macro support: the Axum extractors an `#[idempotent]` expansion adds to a handler,
//! and what a consumer function's expansion (`#[idempotent(key = …)]`) calls.
//!
//! Private to the crate: [`Guard`] (added right after the scope argument) and [`Hashed`]
//! (wrapping the handler's last extractor) are what the attribute macro generates, named
//! only through `__private`, and they change with it. Users write `#[idempotent(...)]`,
//! or call [`Idempotency::run`] from their own code.
//!
//! Both read the request (key, body, fingerprint) through the crate's front door, the
//! same code the tower [`IdempotencyLayer`](crate::layer::IdempotencyLayer) calls.

use axum::extract::{FromRef, FromRequest, FromRequestParts, Request};
use axum::response::{IntoResponse, Response};
use http::request::Parts;

use crate::config::HandlerConfig;
use crate::engine::{Idempotency, Outcome, Refused};
use crate::fingerprint::{Fingerprint, FingerprintMode, RequestFingerprint};
use crate::key::IdempotencyKey;
use crate::problem::key_problem;
use crate::rendering::ProblemRenderer;
use crate::request::{self, Covered, KeyLabel};

/// The argument the expansion adds right after the scope argument: the parsed
/// `Idempotency-Key` and the engine, found in the router state through `FromRef`.
///
/// Rejects with `400` problem+json when the key is missing or invalid — after
/// authentication (an unauthenticated caller gets its `401` first), before the body is
/// read and before the store is touched. `Guard<true>` (`key = optional`) lets a request
/// without the header through, unprotected; a malformed key is still `400`.
#[derive(Debug, Clone)]
pub struct Guard<const KEY_OPTIONAL: bool = false> {
    engine: Idempotency,
    /// `None` only for `Guard<true>`, when the request carries no key.
    key: Option<String>,
}

impl<S, const KEY_OPTIONAL: bool> FromRequestParts<S> for Guard<KEY_OPTIONAL>
where
    Idempotency: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let engine = Idempotency::from_ref(state);
        let key = request::read_key(parts, &engine, KEY_OPTIONAL, KeyLabel::Route)
            .map_err(|err| engine.rendered(key_problem(&err).into_answer()))?;
        // For `Hashed`, which reads the body after this and has no engine of its own.
        if let Some(renderer) = engine.problem_renderer() {
            parts.extensions.insert(renderer.clone());
        }
        Ok(Self { engine, key })
    }
}

/// A router state the engine can be taken from (`Idempotency: FromRef<Self>`), under a
/// name the compiler shows: `#[idempotent(state = AppState)]` checks its state with
/// [`check_state_gives_engine`], so a forgotten `FromRef` impl is reported on the
/// attribute's `AppState`, naming the impl to write, rather than only as Axum's "not a
/// `Handler`" at the route.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent(state = {Self})]`: the router state `{Self}` does not give the handler its engine",
    label = "`Idempotency` does not implement `FromRef<{Self}>`",
    note = "add `impl axum::extract::FromRef<{Self}> for idempotent_runtime::Idempotency {{ fn from_ref(state: &{Self}) -> Self {{ state.idempotency.clone() }} }}` (with the name of your state's `Idempotency` field)"
)]
pub trait StateGivesEngine {}

// `do_not_recommend`: the error names this trait (and its note the fix), not the
// `FromRef` bound behind it, whose candidates (`impl FromRef<T> for T`) mislead.
#[diagnostic::do_not_recommend]
impl<S> StateGivesEngine for S where Idempotency: FromRef<S> {}

/// Compiles only when `S` gives the engine: the check `state = S` expands to.
pub const fn check_state_gives_engine<S: StateGivesEngine>() {}

impl Guard {
    /// The key a required guard was extracted with.
    fn required_key(&self) -> &str {
        self.key
            .as_deref()
            .expect("`Guard<false>` refuses a request without a key at extraction")
    }

    /// Runs the handler through the engine; see [`Idempotency::run`].
    pub async fn run<F, Fut, R>(
        self,
        config: &HandlerConfig,
        scope: &str,
        fingerprint: RequestFingerprint,
        handler: F,
    ) -> Response
    where
        F: FnOnce(IdempotencyKey) -> Fut + Send + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: IntoResponse + 'static,
    {
        self.engine
            .run(config, scope, self.required_key(), fingerprint, handler)
            .await
    }

    /// Runs a transactional handler through the engine; see
    /// [`Idempotency::run_in_transaction`].
    #[cfg(feature = "sql")]
    pub async fn run_in_transaction<DB, F, Fut, T, E>(
        self,
        config: &HandlerConfig,
        scope: &str,
        fingerprint: RequestFingerprint,
        handler: F,
    ) -> Response
    where
        DB: crate::transaction::TxDatabase,
        F: FnOnce(IdempotencyKey, crate::transaction::Tx<DB>) -> Fut + Send + 'static,
        Fut: Future<Output = (Result<T, E>, crate::transaction::Tx<DB>)> + Send + 'static,
        T: IntoResponse + 'static,
        E: IntoResponse + 'static,
    {
        self.engine
            .run_in_transaction_owned(config, scope, self.required_key(), fingerprint, handler)
            .await
    }
}

impl Guard<true> {
    /// `key = optional`: with a key, runs the handler through the engine (see
    /// [`Idempotency::run`]) and hands it `Some(key)`; without one, runs it unprotected
    /// with `None` — nothing is claimed, stored or replayed.
    pub async fn run<F, Fut, R>(
        self,
        config: &HandlerConfig,
        scope: &str,
        fingerprint: RequestFingerprint,
        handler: F,
    ) -> Response
    where
        F: FnOnce(Option<IdempotencyKey>) -> Fut + Send + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: IntoResponse + 'static,
    {
        match &self.key {
            Some(key) => {
                self.engine
                    .run(config, scope, key, fingerprint, |key| handler(Some(key)))
                    .await
            }
            None => self.engine.run_unprotected(config, handler(None)).await,
        }
    }
}

/// Wraps a handler's last extractor `T`: reads the raw body (within the route's
/// `DefaultBodyLimit`), keeps it for the fingerprint, then runs `T` on a rebuilt request.
/// Use `Hashed<()>` for handlers without a body extractor.
#[derive(Debug)]
pub struct Hashed<T> {
    value: T,
    covered: Covered,
}

/// The marker type `Hashed<T>` extracts through: `T`'s own marker wrapped, so `Hashed`
/// works whether `T` reads the body or only the request head.
#[doc(hidden)]
#[derive(Debug)]
pub struct ViaHashed<M>(std::marker::PhantomData<M>);

impl<S, T, M> FromRequest<S, ViaHashed<M>> for Hashed<T>
where
    S: Send + Sync,
    T: FromRequest<S, M>,
{
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let (parts, body) = req.into_parts();
        // The application's renderer, which the guard (extracted first) left there.
        let renderer = parts.extensions.get::<ProblemRenderer>().cloned();
        let (rebuilt, covered) =
            request::read_body(parts, body)
                .await
                .map_err(|refused| match renderer {
                    Some(renderer) => renderer.render(refused),
                    None => refused,
                })?;
        let value = T::from_request(rebuilt, state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Self { value, covered })
    }
}

impl<T> Hashed<T> {
    /// The inner extractor's value and the request's fingerprint (computed when the
    /// engine first needs it: a replay from the replay cache does not).
    pub fn into_parts(self, mode: FingerprintMode) -> (T, RequestFingerprint) {
        (self.value, self.covered.fingerprint(mode))
    }
}

// Consumer functions: `#[idempotent(key = …, scope = …)]` on a plain `async fn`. The
// expansion evaluates the attribute's expressions through these traits, each spanned on
// the user's expression, so that a value of the wrong type is reported there with the
// fix (`on_unimplemented`), and the blanket impls are `do_not_recommend`ed so that the
// message is this trait's rather than the bound behind it.

/// The value of `key = …`: the message's id, as text.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent(key = …)]`: the key must be text or a number, and `{Self}` is not",
    label = "`{Self}` does not implement `Display`",
    note = "`key` is the message's id, an expression over the function's arguments whose value implements `Display` (a `String`, `&str`, `u64`, `Uuid`…): e.g. `key = order.id`"
)]
pub trait KeyText {
    /// The key's text.
    fn key_text(&self) -> String;
}

#[diagnostic::do_not_recommend]
impl<T: std::fmt::Display + ?Sized> KeyText for T {
    fn key_text(&self) -> String {
        self.to_string()
    }
}

/// The value of `scope = …` on a consumer function: the key space, as text.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent(scope = …)]`: the scope must be text, and `{Self}` is not",
    label = "`{Self}` does not implement `Display`",
    note = "on a consumer function `scope` names the key space the ids are unique in: a string (`scope = \"orders\"`) or an expression over the arguments whose value implements `Display` (`scope = order.tenant`)"
)]
pub trait ScopeText {
    /// The scope's text.
    fn scope_text(&self) -> String;
}

#[diagnostic::do_not_recommend]
impl<T: std::fmt::Display + ?Sized> ScopeText for T {
    fn scope_text(&self) -> String {
        self.to_string()
    }
}

/// The value of `payload = …` (or the function's one message argument): what the key
/// must keep meaning, fingerprinted by its JSON ([`Fingerprint::of_json`]).
#[diagnostic::on_unimplemented(
    message = "`#[idempotent]`: the payload `{Self}` cannot be fingerprinted",
    label = "`{Self}` does not implement `serde::Serialize`",
    note = "the payload's JSON is what a key must keep meaning (the same key with another payload is `Outcome::KeyReused`): derive `serde::Serialize` for `{Self}`, or name another argument with `payload = …`"
)]
pub trait Payload {
    /// The payload's fingerprint, or serde's message when it does not serialise.
    fn payload_fingerprint(&self) -> Result<Fingerprint, String>;
}

#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + ?Sized> Payload for T {
    fn payload_fingerprint(&self) -> Result<Fingerprint, String> {
        Fingerprint::of_json(self).map_err(|err| err.to_string())
    }
}

/// The value of `engine = …`: an [`Idempotency`], however it is held. (Its impls are
/// not recommended in errors: the note names them, and the fix.)
#[diagnostic::on_unimplemented(
    message = "`#[idempotent(engine = …)]`: `{Self}` is not the engine",
    label = "expected an `Idempotency`, found `{Self}`",
    note = "write `engine = state.idempotency` (an `Idempotency`, `&Idempotency` or `Arc<Idempotency>`), or drop `engine` and take `idempotency: &Idempotency` as an argument"
)]
pub trait Engine {
    /// The engine.
    fn engine(&self) -> &Idempotency;
}

#[diagnostic::do_not_recommend]
impl Engine for Idempotency {
    fn engine(&self) -> &Idempotency {
        self
    }
}

#[diagnostic::do_not_recommend]
impl<T: Engine + ?Sized> Engine for &T {
    fn engine(&self) -> &Idempotency {
        (**self).engine()
    }
}

#[diagnostic::do_not_recommend]
impl<T: Engine + ?Sized> Engine for std::sync::Arc<T> {
    fn engine(&self) -> &Idempotency {
        (**self).engine()
    }
}

/// The `T` of a consumer function's `Result<T, E>`: recorded as JSON, replayed to every
/// duplicate.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent]`: the output `{Self}` cannot be recorded and replayed",
    label = "`{Self}` is not `Serialize + DeserializeOwned`",
    note = "the `Ok` value of an `#[idempotent(key = …)]` function is stored as JSON and handed to every duplicate: derive `serde::Serialize` and `serde::Deserialize` for `{Self}`; the `Err` value is never stored and need not be"
)]
pub trait RecordedOutput: serde::Serialize + serde::de::DeserializeOwned {}

#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + serde::de::DeserializeOwned> RecordedOutput for T {}

/// Runs a consumer function's body through [`Idempotency::once`]; a payload that did not
/// serialise runs nothing ([`Refused::PayloadUnserialisable`]). `T` first: the expansion
/// names it (spanned on the user's `T`), so a `T` that cannot be recorded is reported
/// there.
pub async fn once<T, E, F, Fut>(
    engine: &Idempotency,
    config: &HandlerConfig,
    scope: &str,
    key: &str,
    payload: Result<Fingerprint, String>,
    function: F,
) -> Outcome<T, E>
where
    T: RecordedOutput + Send + 'static,
    E: Send + 'static,
    F: FnOnce(IdempotencyKey) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
{
    match payload {
        Ok(fingerprint) => engine.once(config, scope, key, fingerprint, function).await,
        Err(error) => unserialisable(error),
    }
}

/// Runs a transactional consumer function's body through
/// [`Idempotency::once_in_transaction`]; see [`once`].
#[cfg(feature = "sql")]
pub async fn once_in_transaction<T, E, DB, F, Fut>(
    engine: &Idempotency,
    config: &HandlerConfig,
    scope: &str,
    key: &str,
    payload: Result<Fingerprint, String>,
    function: F,
) -> Outcome<T, E>
where
    T: RecordedOutput + Send + 'static,
    E: Send + 'static,
    DB: crate::transaction::TxDatabase,
    F: FnOnce(IdempotencyKey, crate::transaction::Tx<DB>) -> Fut + Send + 'static,
    Fut: Future<Output = (Result<T, E>, crate::transaction::Tx<DB>)> + Send + 'static,
{
    match payload {
        Ok(fingerprint) => {
            engine
                .once_in_transaction_owned(config, scope, key, fingerprint.into(), function)
                .await
        }
        Err(error) => unserialisable(error),
    }
}

fn unserialisable<T, E>(error: String) -> Outcome<T, E> {
    tracing::error!(
        event = "refused",
        reason = "payload_unserialisable",
        error = %error,
        "the payload of an #[idempotent] function does not serialise; nothing ran"
    );
    Outcome::Refused(Refused::PayloadUnserialisable(error))
}
