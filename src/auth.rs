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
                    // Never the valid keys: a refusal hands no credentials to whoever
                    // asks. The README and the startup banner name the demo's keys.
                    "Send `Authorization: Bearer <api key>` with a valid API key.",
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
            // The document is served to anyone: it names no key (the banner does).
            .description(Some(
                "A demo API key, as printed in the demo's startup banner. Idempotency keys \
                 are unique per account.",
            ))
            .build();
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme(BEARER_SCHEME, SecurityScheme::Http(scheme));
    }
}

#[cfg(test)]
mod tests {
    use axum::body::to_bytes;
    use http::Request;

    use super::*;

    /// What an unauthenticated caller is told: the `401` body, as text.
    async fn refusal(authorization: Option<&str>) -> String {
        let mut request = Request::post("/payments");
        if let Some(value) = authorization {
            request = request.header(header::AUTHORIZATION, value);
        }
        let (mut parts, ()) = request.body(()).unwrap().into_parts();
        let response = Caller::from_request_parts(&mut parts, &())
            .await
            .expect_err("not a demo key");
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_401_names_the_scheme_but_no_api_key() {
        for authorization in [None, Some("Bearer sk_test_mallory"), Some("Basic YWxpY2U=")] {
            let body = refusal(authorization).await;
            assert!(body.contains("Authorization: Bearer"), "{body}");
            assert!(
                !body.contains("sk_test_"),
                "a 401 hands out no credentials: {body}"
            );
        }
    }

    #[test]
    fn the_published_security_scheme_names_no_api_key() {
        let mut doc = utoipa::openapi::OpenApiBuilder::new().build();
        BearerAuth.modify(&mut doc);
        let json = serde_json::to_string(&doc).unwrap();
        assert!(json.contains("bearer"), "{json}");
        assert!(
            !json.contains("sk_test_"),
            "the OpenAPI document is served to anyone: {json}"
        );
    }
}
