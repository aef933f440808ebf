//! [`RetryMiddleware`]: the client half for `reqwest-middleware` clients.

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{Error, Middleware, Next, Result};

use crate::call::{Call, ClientError, Ended, attach_key};
use crate::key::CallKey;
use crate::policy::RetryPolicy;

/// A `reqwest-middleware` middleware that retries a call safely: one `Idempotency-Key`
/// per call, the same on every attempt, and retries only when sending the request twice
/// cannot do the work twice.
///
/// - **The key** is the [`CallKey`] in the request's extensions, else the
///   `Idempotency-Key` header the caller set, else (with
///   [`RetryPolicy::with_generated_keys`]) a new UUIDv4 for a request whose method is not
///   idempotent.
/// - **Retried**: connection errors and timeouts (no answer head), `409` (the key is still
///   running), `429`, `502`, `503` and `504`, after the `Retry-After` the server sent
///   (capped) or an exponential backoff with full jitter; within the policy's attempt
///   budget and deadline. Never any other answer.
/// - **Sent once**: a request that is neither idempotent by method (`GET`, `PUT`,
///   `DELETE`, …) nor keyed, whatever happens to it.
/// - **The body** is kept for resending; a request that may be retried but has a
///   streaming body is refused with [`ClientError::BodyNotReplayable`] before it is sent.
///
/// Each attempt is an event of `tracing` in an `idempotent_call` span; the final response
/// carries a [`CallReport`](crate::CallReport) ([`ResponseExt`](crate::ResponseExt)).
///
/// ```
/// use idempotent_client::{CallKey, ResponseExt, RetryMiddleware, RetryPolicy};
///
/// # async fn charge(derived_key: String) -> Result<(), Box<dyn std::error::Error>> {
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(RetryMiddleware::new(RetryPolicy::default()))
///     .build();
/// // One logical call: `derived_key` is `key.derive("charge")` inside an #[idempotent]
/// // handler, so a retry of the handler sends the same key too.
/// let response = client
///     .post("http://127.0.0.1:4242/v1/charges")
///     .with_extension(CallKey::new(derived_key)?)
///     .body(r#"{"amount": 10000}"#)
///     .send()
///     .await?;
/// if response.is_replayed() {
///     println!("the provider had already charged this key");
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RetryMiddleware {
    policy: RetryPolicy,
}

impl RetryMiddleware {
    /// Retries as `policy` says.
    pub fn new(policy: RetryPolicy) -> Self {
        Self { policy }
    }
}

#[async_trait::async_trait]
impl Middleware for RetryMiddleware {
    async fn handle(
        &self,
        mut request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<Response> {
        let given = extensions.get::<CallKey>();
        let method = request.method().clone();
        let key = attach_key(&method, request.headers_mut(), given, &self.policy);
        let mut call = Call::start(self.policy, &method, request.url(), key);
        let retryable = call.retryable();
        if retryable && request.try_clone().is_none() {
            return Err(Error::middleware(ClientError::BodyNotReplayable));
        }
        let mut original = Some(request);
        loop {
            let attempt = if retryable {
                // Bytes bodies clone by reference count; checked to be cloneable above.
                original.as_ref().and_then(Request::try_clone)
            } else {
                // A request that may not be retried is sent as it is, once.
                original.take()
            }
            .expect("the body was checked to clone, and the policy sends a request it may not retry once");
            let sent = next.clone().run(attempt, extensions);
            match call.attempt(sent, no_answer).await {
                None => continue,
                Some(Ended::Answer(response)) => return Ok(response),
                Some(Ended::Failed(error)) => return Err(error),
                Some(Ended::Client(error)) => return Err(Error::middleware(error)),
            }
        }
    }
}

/// Whether `error` means the attempt got no answer head (retried, if the request may be):
/// a connection that failed, was reset or closed, or a timeout. A request that could not
/// be built, a redirect loop, and errors of other middlewares end the call.
fn no_answer(error: &Error) -> bool {
    match error {
        Error::Reqwest(error) => error.is_connect() || error.is_timeout() || error.is_request(),
        Error::Middleware(_) => false,
    }
}
