//! [`IdempotencyLayer`]: the `#[idempotent]` contract as a tower layer, for routes (or a
//! whole router) protected without the macro.
//!
//! Same engine, same stores, same answers: the layer parses the `Idempotency-Key`
//! header, reads and fingerprints the body, and calls the wrapped service through
//! [`Idempotency::run`] — uncancellable, like an attribute handler: a client that hangs
//! up cancels nothing (the rest moves to a task of the engine's own). The handler finds the claimed key as an
//! `Extension<IdempotencyKey>`.
//!
//! The scope never comes from a header the client controls: it comes from the request
//! parts ([`scope_with`](IdempotencyLayer::scope_with)) or from an extension your
//! authentication layer sets ([`scope_from_extension`](IdempotencyLayer::scope_from_extension)),
//! so that layer must run first (be added after, i.e. outside, this one). A request for
//! which no scope is found is answered `500` problem+json (`idempotency_scope_missing`),
//! logged as an error, and never reaches the handler.
//!
//! ```
//! use std::borrow::Cow;
//! use std::time::Duration;
//!
//! use axum::extract::{Extension, Request};
//! use axum::http::StatusCode;
//! use axum::middleware::{self, Next};
//! use axum::response::Response;
//! use axum::routing::post;
//! use axum::Router;
//! use idempotent_runtime::layer::IdempotencyLayer;
//! use idempotent_runtime::store::MemoryStore;
//! use idempotent_runtime::{AsProblem, Idempotency, IdempotencyKey, Scope};
//!
//! /// What the app's authentication puts in the request's extensions.
//! #[derive(Clone)]
//! struct Caller(String);
//!
//! impl Scope for Caller {
//!     fn scope(&self) -> Cow<'_, str> {
//!         Cow::Borrowed(&self.0)
//!     }
//! }
//!
//! async fn authenticate(mut request: Request, next: Next) -> Result<Response, StatusCode> {
//!     let account = request
//!         .headers()
//!         .get("authorization")
//!         .and_then(|value| value.to_str().ok())
//!         .and_then(|value| value.strip_prefix("Bearer sk_"))
//!         .ok_or(StatusCode::UNAUTHORIZED)?
//!         .to_owned();
//!     request.extensions_mut().insert(Caller(account));
//!     Ok(next.run(request).await)
//! }
//!
//! /// A plain handler: no attribute. Its extractor runs after the claim: `AsProblem` has
//! /// the layer release the key on a rejection (a body that is not UTF-8) instead of
//! /// recording it.
//! async fn create_order(
//!     Extension(key): Extension<IdempotencyKey>,
//!     AsProblem(body): AsProblem<String>,
//! ) -> (StatusCode, String) {
//!     (StatusCode::CREATED, format!("{} {body}", key.derive("order")))
//! }
//!
//! let idempotency = Idempotency::new(MemoryStore::new());
//! let app: Router = Router::new()
//!     .route("/orders", post(create_order))
//!     .route_layer(
//!         IdempotencyLayer::new(idempotency)
//!             .scope_from_extension::<Caller>()
//!             .ttl(Duration::from_secs(24 * 60 * 60))
//!             .name("orders"),
//!     )
//!     // Outside the idempotency layer: authentication runs first.
//!     .layer(middleware::from_fn(authenticate));
//! ```

use std::convert::Infallible;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::BoxError;
use axum::body::{Body, HttpBody};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::request::Parts;
use http::{Method, Request, StatusCode};
use tower::{Layer, Service, ServiceExt};
use tracing::error;
#[cfg(feature = "webhooks")]
use tracing::warn;

use crate::config::{HandlerConfig, OnServerError};
use crate::engine::Idempotency;
use crate::fingerprint::FingerprintMode;
use crate::problem::{Problem, codes, key_problem};
use crate::request::{self, KeyLabel};
use crate::scope::Scope;
#[cfg(feature = "webhooks")]
use crate::webhook::WebhookVerifier;

/// The methods a layer protects unless told otherwise: the ones that are not idempotent
/// by definition.
pub const DEFAULT_METHODS: [Method; 2] = [Method::POST, Method::PATCH];

/// A tower [`Layer`] that gives the routes it wraps the `#[idempotent]` contract: claim
/// → fingerprint → execute → record, replays, `409`, `422`, `400` for bad keys, `503`
/// when the store is down. See the [module docs](self) for a complete router.
///
/// Built in two steps: [`new`](Self::new) over the engine, then where the scope comes
/// from ([`scope_with`](Self::scope_with) or
/// [`scope_from_extension`](Self::scope_from_extension)). Only a layer that knows its
/// scope is a `Layer` (`IdempotencyLayer<ScopeSource>`); forgetting it is a compile
/// error, not an unscoped run.
///
/// The policy is a [`HandlerConfig`], as for the attribute: set it whole with
/// [`config`](Self::config) or piece by piece ([`ttl`](Self::ttl),
/// [`lease`](Self::lease), [`fingerprint`](Self::fingerprint),
/// [`on_server_error`](Self::on_server_error), [`wait`](Self::wait), [`name`](Self::name),
/// [`key_optional`](Self::key_optional)); [`policy`](Self::policy) reads it back.
/// Requests with other methods than [`methods`](Self::methods) (default `POST` and
/// `PATCH`) pass straight through.
///
/// The body is read whole before the claim, within the `DefaultBodyLimit` the request
/// carries (axum's default of 2 MiB when none is set; add `DefaultBodyLimit` outside
/// this layer to change it, which also sets it for the handler's extractors) and within
/// a `tower_http` `RequestBodyLimitLayer`; over the limit is `413` problem+json and
/// nothing is claimed.
#[derive(Clone)]
pub struct IdempotencyLayer<Sc = ScopeSource> {
    engine: Idempotency,
    config: HandlerConfig,
    methods: Arc<[Method]>,
    scope: Sc,
    keys: KeySource,
}

/// Where a protected request's key comes from.
#[derive(Debug, Clone)]
enum KeySource {
    /// The engine's key header (`Idempotency-Key`).
    Header,
    /// The `webhook-id` of a Standard Webhooks delivery, once it is verified.
    #[cfg(feature = "webhooks")]
    Webhook(Arc<WebhookVerifier>),
}

/// A layer that does not know yet where the scope comes from; not a [`Layer`].
#[derive(Debug, Clone, Copy)]
pub struct NoScope;

/// A function from the request parts to the caller's scope (`None`: no caller).
type ScopeFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Where a layer finds a request's scope: a function of the request parts.
#[derive(Clone)]
pub struct ScopeSource {
    scope_of: Arc<ScopeFn>,
    /// What the scope comes from, for the log line when there is none.
    from: &'static str,
}

impl fmt::Debug for ScopeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopeSource")
            .field("from", &self.from)
            .finish_non_exhaustive()
    }
}

impl<Sc: fmt::Debug> fmt::Debug for IdempotencyLayer<Sc> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("config", &self.config)
            .field("methods", &self.methods)
            .field("scope", &self.scope)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer<NoScope> {
    /// A layer over `engine` with the engine's default policy, protecting `POST` and
    /// `PATCH`, key required. Say where the scope comes from next.
    pub fn new(engine: Idempotency) -> Self {
        Self {
            engine,
            config: HandlerConfig::new(),
            methods: Arc::new(DEFAULT_METHODS),
            scope: NoScope,
            keys: KeySource::Header,
        }
    }
}

impl<Sc> IdempotencyLayer<Sc> {
    /// Takes the scope from the request parts: `scope_of` returns the authenticated
    /// caller's id, or `None` when there is none (answered `500`, the handler not run).
    /// Read it from what your authentication established (an extension, a verified
    /// token), never from a header the client can set freely.
    pub fn scope_with<F>(self, scope_of: F) -> IdempotencyLayer<ScopeSource>
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.with_scope(ScopeSource {
            scope_of: Arc::new(scope_of),
            from: "the layer's scope function",
        })
    }

    /// Takes the scope from the request extension of type `T` that the app's
    /// authentication layer inserts (that layer must be outside this one). A request
    /// without it is answered `500`, the handler not run.
    pub fn scope_from_extension<T>(self) -> IdempotencyLayer<ScopeSource>
    where
        T: Scope + Clone + Send + Sync + 'static,
    {
        self.with_scope(ScopeSource {
            scope_of: Arc::new(|parts: &Parts| {
                parts
                    .extensions
                    .get::<T>()
                    .map(|caller| caller.scope().into_owned())
            }),
            from: std::any::type_name::<T>(),
        })
    }

    /// Protects incoming webhooks from `sender`, signed the Standard Webhooks way (see
    /// [`crate::webhook`]): each delivery is verified by `verifier` before anything else
    /// — one that fails is answered `401` problem+json and nothing is claimed or stored
    /// — and then claimed under its `webhook-id`, in the scope `webhook:{sender}`, so
    /// that a redelivery replays the first delivery's answer. The `Idempotency-Key`
    /// header plays no part.
    #[cfg(feature = "webhooks")]
    pub fn standard_webhooks(
        self,
        sender: &str,
        verifier: WebhookVerifier,
    ) -> IdempotencyLayer<ScopeSource> {
        let scope = format!("webhook:{sender}");
        let mut layer = self.with_scope(ScopeSource {
            scope_of: Arc::new(move |_: &Parts| Some(scope.clone())),
            from: "the webhook sender",
        });
        layer.keys = KeySource::Webhook(Arc::new(verifier));
        layer
    }

    fn with_scope(self, scope: ScopeSource) -> IdempotencyLayer<ScopeSource> {
        IdempotencyLayer {
            engine: self.engine,
            config: self.config,
            methods: self.methods,
            scope,
            keys: self.keys,
        }
    }

    /// The whole policy at once (what `#[idempotent(...)]` writes down for a handler).
    pub fn config(mut self, config: HandlerConfig) -> Self {
        self.config = config;
        self
    }

    /// How long a key is remembered (default: the engine's).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.config = self.config.ttl(ttl);
        self
    }

    /// How long a running request keeps its claim between heartbeats (default: the
    /// engine's).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config = self.config.lease(lease);
        self
    }

    /// How the request is fingerprinted (default: the raw body).
    pub fn fingerprint(mut self, mode: FingerprintMode) -> Self {
        self.config = self.config.fingerprint(mode);
        self
    }

    /// What a 5xx answer does to the claim (default: release it).
    pub fn on_server_error(mut self, policy: OnServerError) -> Self {
        self.config = self.config.on_server_error(policy);
        self
    }

    /// How long a duplicate that finds the original still running waits for its outcome
    /// before `409` (default: the engine's, itself off unless set); see
    /// [`HandlerConfig::wait`].
    pub fn wait(mut self, wait: Duration) -> Self {
        self.config = self.config.wait(wait);
        self
    }

    /// Names the protected routes, for their own `Retry-After` estimate (and metrics).
    pub fn name(mut self, name: &'static str) -> Self {
        self.config = self.config.name(name);
        self
    }

    /// The methods to protect (default `POST` and `PATCH`); requests with any other
    /// method pass straight through.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// Rollout: a request without the `Idempotency-Key` header runs the handler
    /// unprotected (logged at debug, `event = "unprotected"`) instead of `400`. A
    /// malformed key is still `400`; a valid one is protected as usual.
    pub fn key_optional(mut self) -> Self {
        self.config = self.config.key_optional();
        self
    }

    /// The policy this layer applies (to publish it, e.g. with
    /// `openapi::PublishedPolicy`, feature `utoipa`).
    pub fn policy(&self) -> HandlerConfig {
        self.config
    }
}

impl<S> Layer<S> for IdempotencyLayer<ScopeSource> {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            shared: Arc::new(Shared {
                engine: self.engine.clone(),
                config: self.config,
                methods: self.methods.clone(),
                scope: self.scope.clone(),
                keys: self.keys.clone(),
            }),
        }
    }
}

/// The service an [`IdempotencyLayer`] wraps around `S`.
///
/// `S` is called inside the engine's uncancellable request, so it must be `Clone + Send +
/// 'static` with a `Send` future; it must never fail (`Error = Infallible`, as every
/// axum route). It is always ready, as axum's routes are: `S` is driven to readiness
/// right before the call.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    shared: Arc<Shared>,
}

struct Shared {
    engine: Idempotency,
    config: HandlerConfig,
    methods: Arc<[Method]>,
    scope: ScopeSource,
    keys: KeySource,
}

impl<S> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("config", &self.shared.config)
            .field("methods", &self.shared.methods)
            .field("scope", &self.shared.scope)
            .finish_non_exhaustive()
    }
}

impl<S, B> Service<Request<B>> for IdempotencyService<S>
where
    S: Service<Request<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Response: IntoResponse + 'static,
    S::Future: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (inner, shared) = (self.inner.clone(), self.shared.clone());
        let request = request.map(Body::new);
        if shared.methods.contains(request.method()) {
            Box::pin(async move {
                let response = protect(&shared, inner, request).await;
                Ok(shared.engine.rendered(response))
            })
        } else {
            Box::pin(async move { Ok(call_inner(inner, request).await) })
        }
    }
}

/// The contract around one request: scope, key, body and fingerprint, then the engine.
/// Everything that can refuse the request does so before the store is touched.
async fn protect<S>(shared: &Shared, inner: S, request: Request<Body>) -> Response
where
    S: Service<Request<Body>, Error = Infallible> + Send + 'static,
    S::Response: IntoResponse + 'static,
    S::Future: Send + 'static,
{
    let (parts, body) = request.into_parts();
    let Some(scope) = (shared.scope.scope_of)(&parts) else {
        error!(
            event = "scope_missing",
            from = shared.scope.from,
            "no idempotency scope for this request (is the authentication layer outside the IdempotencyLayer?); handler not run"
        );
        return scope_missing();
    };
    match &shared.keys {
        KeySource::Header => {}
        #[cfg(feature = "webhooks")]
        KeySource::Webhook(verifier) => {
            return protect_webhook(shared, verifier, inner, scope, parts, body).await;
        }
    }
    let (config, label) = (&shared.config, KeyLabel::Handler(shared.config.name));
    let key = match request::read_key(&parts, &shared.engine, config.key_optional, label) {
        Ok(Some(key)) => key,
        Ok(None) => {
            let request = Request::from_parts(parts, body);
            return shared
                .engine
                .run_unprotected(config, call_inner(inner, request))
                .await;
        }
        Err(err) => return key_problem(&err).into_answer(),
    };
    let (request, covered) = match request::read_body(parts, body).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    run(shared, inner, &scope, &key, request, covered).await
}

/// The contract around one webhook delivery: its body read and its signature verified
/// before anything is claimed, then the engine under its `webhook-id`.
#[cfg(feature = "webhooks")]
async fn protect_webhook<S>(
    shared: &Shared,
    verifier: &WebhookVerifier,
    inner: S,
    scope: String,
    parts: Parts,
    body: Body,
) -> Response
where
    S: Service<Request<Body>, Error = Infallible> + Send + 'static,
    S::Response: IntoResponse + 'static,
    S::Future: Send + 'static,
{
    let (request, covered) = match request::read_body(parts, body).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let key = match verifier.verify(request.headers(), covered.body()) {
        Ok(id) => id.to_owned(),
        Err(unverified) => {
            warn!(
                event = "webhook_unverified",
                scope = %scope,
                reason = %unverified,
                "webhook delivery refused before the claim"
            );
            return unverified.problem().into_answer();
        }
    };
    run(shared, inner, &scope, &key, request, covered).await
}

/// Runs the wrapped service through the engine under `key`, the key in its extensions.
async fn run<S>(
    shared: &Shared,
    inner: S,
    scope: &str,
    key: &str,
    mut request: Request<Body>,
    covered: request::Covered,
) -> Response
where
    S: Service<Request<Body>, Error = Infallible> + Send + 'static,
    S::Response: IntoResponse + 'static,
    S::Future: Send + 'static,
{
    let config = &shared.config;
    let fingerprint = covered.fingerprint(config.fingerprint);
    shared
        .engine
        .run(config, scope, key, fingerprint, move |key| {
            request.extensions_mut().insert(key);
            call_inner(inner, request)
        })
        .await
}

/// Drives `inner` to readiness and calls it.
async fn call_inner<S>(inner: S, request: Request<Body>) -> Response
where
    S: Service<Request<Body>, Error = Infallible>,
    S::Response: IntoResponse,
{
    match inner.oneshot(request).await {
        Ok(response) => response.into_response(),
        Err(never) => match never {},
    }
}

/// The answer when no scope is found: a server misconfiguration, never an unscoped run.
fn scope_missing() -> Response {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        codes::SCOPE_MISSING,
        "Idempotency scope missing",
        "The server could not tell whose idempotency key this is, so the request was not processed. This is a server misconfiguration; retrying will not help.",
    )
    .into_answer()
}
