//! Macro support: the Axum extractors an `#[idempotent]` expansion adds to a handler.
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
use crate::engine::Idempotency;
use crate::fingerprint::{FingerprintMode, RequestFingerprint};
use crate::key::IdempotencyKey;
use crate::problem::key_problem;
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
            .map_err(|err| key_problem(&err).into_response())?;
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
            .run_in_transaction(config, scope, self.required_key(), fingerprint, handler)
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
        let (rebuilt, covered) = request::read_body(parts, body).await?;
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
