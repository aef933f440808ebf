//! Bearer-token authentication with fixed demo API keys. The authenticated account is
//! the idempotency scope: keys never collide across callers.

use std::borrow::Cow;

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::{HeaderValue, StatusCode, header};
use idempotent_runtime::{Problem, Scope};
use utoipa::Modify;
use utoipa::openapi::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};

/// The demo API keys and the accounts they authenticate.
pub const DEMO_KEYS: [(&str, &str); 2] =
    [("sk_test_alice", "acct_alice"), ("sk_test_bob", "acct_bob")];

/// The authenticated caller: an account id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub String);

impl Caller {
    /// The account id.
    pub fn account(&self) -> &str {
        &self.0
    }
}

impl Scope for Caller {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.0)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let account = token.and_then(|token| {
            DEMO_KEYS
                .iter()
                .find(|(key, _)| *key == token)
                .map(|(_, account)| *account)
        });
        match account {
            Some(account) => Ok(Caller(account.to_owned())),
            None => {
                let mut response = Problem::new(
                    StatusCode::UNAUTHORIZED,
                    UNAUTHENTICATED,
                    "Unauthenticated",
                    "Send `Authorization: Bearer <api key>`; the demo keys are sk_test_alice and sk_test_bob.",
                )
                .into_response();
                // RFC 9110: a 401 names the scheme the client should use.
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                Err(response)
            }
        }
    }
}

/// The problem code of the `401` for a missing or unknown API key.
pub const UNAUTHENTICATED: &str = "unauthenticated";

/// The name of the bearer security scheme in the demos' OpenAPI documents, for
/// `security(("bearer" = []))` on each operation that takes a [`Caller`].
pub const BEARER_SCHEME: &str = "bearer";

/// Adds the [`BEARER_SCHEME`] security scheme (HTTP bearer, the demo API keys) to an
/// OpenAPI document: a `utoipa` modifier, `#[openapi(modifiers(&BearerAuth))]`.
#[derive(Debug, Clone, Copy)]
pub struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut OpenApi) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some(
                "A demo API key: `sk_test_alice` (account `acct_alice`) or `sk_test_bob` \
                 (`acct_bob`). Idempotency keys are unique per account.",
            ))
            .build();
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme(BEARER_SCHEME, SecurityScheme::Http(scheme));
    }
}
