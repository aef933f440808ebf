//! [`RetryLayer`]: the client half for tower services over `http` requests, such as a
//! hyper client; the same policy as the reqwest middleware.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::util::ServiceExt;
use tower::{BoxError, Layer, Service};

use crate::call::{Call, Ended, attach_key};
use crate::key::CallKey;
use crate::policy::RetryPolicy;

/// A tower layer that retries a call safely, with the rules of
/// [`RetryMiddleware`](crate::RetryMiddleware): one `Idempotency-Key` per call (a
/// [`CallKey`] in the request's extensions, the caller's own header, or a generated key
/// with [`RetryPolicy::with_generated_keys`]), reused on every attempt; retries of
/// failed attempts and of `409`, `429`, `502`–`504` only; a request that is neither
/// idempotent nor keyed is sent once.
///
/// The request body must be `Clone` (a `Full<Bytes>`, a `String`): every attempt sends a
/// copy. Any error of the inner service counts as an attempt without an answer head.
/// Errors are [`BoxError`]s: the inner service's last one, or a
/// [`ClientError`](crate::ClientError).
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use hyper_util::client::legacy::Client;
/// use hyper_util::rt::TokioExecutor;
/// use idempotent_client::{CallKey, RetryLayer, RetryPolicy};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # async fn charge() -> Result<(), tower::BoxError> {
/// let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
/// let client = ServiceBuilder::new()
///     .layer(RetryLayer::new(RetryPolicy::default()))
///     .service(http);
/// let mut request = http::Request::post("http://127.0.0.1:4242/v1/charges")
///     .body(Full::new(Bytes::from_static(br#"{"amount": 10000}"#)))?;
/// request.extensions_mut().insert(CallKey::generate());
/// let response = client.oneshot(request).await?;
/// assert!(response.status().is_success());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RetryLayer {
    policy: RetryPolicy,
}

impl RetryLayer {
    /// Retries as `policy` says.
    pub fn new(policy: RetryPolicy) -> Self {
        Self { policy }
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = RetryService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RetryService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`RetryLayer`] makes.
#[derive(Debug, Clone)]
pub struct RetryService<S> {
    inner: S,
    layer: RetryLayer,
}

impl<S, B, R> Service<Request<B>> for RetryService<S>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Clone + Send + 'static,
    R: Send + 'static,
{
    type Response = Response<R>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each attempt waits for the inner service's readiness itself (`oneshot`).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let policy = self.layer.policy;
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let given = parts.extensions.get::<CallKey>().cloned();
            let key = attach_key(&parts.method, &mut parts.headers, given.as_ref(), &policy);
            let mut call = Call::start(policy, &parts.method, &parts.uri, key);
            loop {
                let attempt = Request::from_parts(parts.clone(), body.clone());
                let sent = inner.clone().oneshot(attempt);
                let sent = async { sent.await.map_err(Into::<BoxError>::into) };
                match call.attempt(sent, |_| true).await {
                    None => continue,
                    Some(Ended::Answer(response)) => return Ok(response),
                    Some(Ended::Failed(error)) => return Err(error),
                    Some(Ended::Client(error)) => return Err(error.into()),
                }
            }
        })
    }
}
