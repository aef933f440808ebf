//! Bearer-token authentication with fixed demo API keys. The authenticated account is
//! the idempotency scope: keys never collide across callers.

use std::borrow::Cow;

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::{StatusCode, header};
use idempotent_runtime::{Problem, Scope};

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
            None => Err(Problem::new(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "Unauthenticated",
                "Send `Authorization: Bearer <api key>`; the demo keys are sk_test_alice and sk_test_bob.",
            )
            .into_response()),
        }
    }
}
