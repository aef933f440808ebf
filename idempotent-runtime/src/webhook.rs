//! Incoming webhooks signed the [Standard Webhooks](https://www.standardwebhooks.com/)
//! way: verified first, then deduplicated by their `webhook-id` like any idempotent
//! request.
//!
//! A sender delivers each event at least once, and retries a delivery it saw no `2xx`
//! for: the same `webhook-id` and body, a new timestamp and signature. A
//! [`WebhookVerifier`] checks a delivery — the `webhook-signature` header holds
//! `v1,<base64>` HMAC-SHA256 signatures of `{webhook-id}.{webhook-timestamp}.{body}`
//! under the shared secret, and the timestamp must be within a tolerance of now — and
//! [`IdempotencyLayer::standard_webhooks`](crate::layer::IdempotencyLayer::standard_webhooks)
//! puts it in front of the engine: a delivery that fails verification is answered `401`
//! problem+json and nothing is claimed or stored; a verified one is claimed under its
//! `webhook-id` in the sender's own scope, so a redelivery gets the first delivery's
//! recorded answer and the handler runs once per event.
//!
//! ```
//! use axum::Router;
//! use axum::routing::post;
//! use idempotent_runtime::layer::IdempotencyLayer;
//! use idempotent_runtime::store::MemoryStore;
//! use idempotent_runtime::webhook::WebhookVerifier;
//! use idempotent_runtime::Idempotency;
//!
//! async fn charge_succeeded(body: String) -> &'static str {
//!     // Book the charge: runs once per event, however often it is delivered.
//!     "booked"
//! }
//!
//! # fn main() -> Result<(), idempotent_runtime::webhook::WebhookSecretError> {
//! // During a secret rotation, pass the old and the new secret: either verifies.
//! let verifier = WebhookVerifier::new(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])?;
//! let app: Router = Router::new()
//!     .route("/webhooks/gateway", post(charge_succeeded))
//!     .route_layer(
//!         IdempotencyLayer::new(Idempotency::new(MemoryStore::new()))
//!             .standard_webhooks("gateway", verifier),
//!     );
//! # Ok(())
//! # }
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{KeyInit, Mac};
use http::{HeaderMap, StatusCode};
use sha2::Sha256;

use crate::key::MAX_KEY_LEN;
use crate::problem::{Problem, codes};

type HmacSha256 = hmac::Hmac<Sha256>;

/// The header naming the event: the key a delivery is deduplicated by.
pub const ID_HEADER: &str = "webhook-id";
/// The header with the delivery's time, in whole seconds since the Unix epoch.
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// The header with the delivery's signatures, space-separated `v1,<base64>` entries.
pub const SIGNATURE_HEADER: &str = "webhook-signature";

/// How far a delivery's timestamp may be from now, either way, unless set otherwise:
/// what the Standard Webhooks specification recommends, against replays of old
/// deliveries.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// One signing secret: the key bytes of a `whsec_<base64>` string.
#[derive(Clone)]
pub struct WebhookSecret {
    key: Vec<u8>,
}

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A secret never reaches a log.
        f.write_str("WebhookSecret(..)")
    }
}

/// A signing secret that is not `whsec_` followed by base64 of at least one byte.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "webhook secret {position} is not a Standard Webhooks secret: expected `whsec_` followed by base64 ({reason})"
)]
pub struct WebhookSecretError {
    /// Which secret, counting from 1.
    pub position: usize,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl WebhookSecret {
    /// Parses a `whsec_<base64>` secret (the prefix may be left out).
    ///
    /// # Errors
    ///
    /// [`WebhookSecretError`] when the rest is not base64 or decodes to nothing.
    pub fn parse(secret: &str) -> Result<Self, WebhookSecretError> {
        let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
        let error = |reason| WebhookSecretError {
            position: 1,
            reason,
        };
        let key = BASE64
            .decode(encoded.trim())
            .map_err(|_| error("not valid base64"))?;
        if key.is_empty() {
            return Err(error("empty"));
        }
        Ok(Self { key })
    }

    /// The `webhook-signature` entry a sender sends for a delivery: `v1,` and the
    /// base64 HMAC-SHA256 of `{id}.{timestamp}.{body}`. For tests and for services
    /// that send webhooks themselves.
    pub fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        let signature = self.mac(id, timestamp, body).finalize().into_bytes();
        format!("v1,{}", BASE64.encode(signature))
    }

    fn mac(&self, id: &str, timestamp: u64, body: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

/// Verifies Standard Webhooks deliveries from one sender: signed with one of its
/// secrets (several while a secret is rotated), stamped within the tolerance of now.
#[derive(Debug, Clone)]
pub struct WebhookVerifier {
    secrets: Vec<WebhookSecret>,
    tolerance: Duration,
}

/// Why a delivery was not verified: answered `401` problem+json
/// (`webhook_unverified`, with this as its `reason`), nothing claimed or stored — or,
/// for an id that cannot be a key, `400` (`webhook_id_invalid`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookError {
    /// A Standard Webhooks header is missing, sent twice or not text.
    #[error("the {0} header is missing, repeated or not text")]
    Header(&'static str),
    /// `webhook-timestamp` is not whole seconds since the Unix epoch.
    #[error("the webhook-timestamp header is not a number of seconds since the Unix epoch")]
    Timestamp,
    /// The delivery's timestamp is further from now than the tolerance.
    #[error(
        "the delivery's timestamp is {skew:?} away from now, more than the {tolerance:?} allowed"
    )]
    Stale {
        /// How far the timestamp is from now, either way.
        skew: Duration,
        /// The tolerance.
        tolerance: Duration,
    },
    /// No `v1` signature in `webhook-signature` is the delivery's under any secret.
    #[error("no signature in the webhook-signature header matches the delivery")]
    Signature,
    /// The signature holds, but the `webhook-id` cannot be an idempotency key: it is
    /// blank, longer than the key limit, or not printable ASCII without spaces.
    #[error("the webhook-id must be 1 to {MAX_KEY_LEN} printable ASCII characters without spaces")]
    Id,
}

impl WebhookVerifier {
    /// A verifier accepting deliveries signed with any of `secrets` (`whsec_<base64>`),
    /// within [`DEFAULT_TOLERANCE`] of now.
    ///
    /// # Errors
    ///
    /// [`WebhookSecretError`] naming the first secret that does not parse, or position 0
    /// when there is none.
    pub fn new<I, S>(secrets: I) -> Result<Self, WebhookSecretError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let secrets = secrets
            .into_iter()
            .enumerate()
            .map(|(at, secret)| {
                WebhookSecret::parse(secret.as_ref()).map_err(|err| WebhookSecretError {
                    position: at + 1,
                    ..err
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if secrets.is_empty() {
            return Err(WebhookSecretError {
                position: 0,
                reason: "no secret given",
            });
        }
        Ok(Self {
            secrets,
            tolerance: DEFAULT_TOLERANCE,
        })
    }

    /// How far a delivery's timestamp may be from now, either way.
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Verifies a delivery now: its `webhook-id` when its signature and timestamp
    /// hold.
    ///
    /// # Errors
    ///
    /// The first [`WebhookError`] the delivery runs into.
    pub fn verify<'h>(&self, headers: &'h HeaderMap, body: &[u8]) -> Result<&'h str, WebhookError> {
        self.verify_at(headers, body, SystemTime::now())
    }

    /// [`verify`](Self::verify) as of `now`.
    ///
    /// # Errors
    ///
    /// As [`verify`](Self::verify).
    pub fn verify_at<'h>(
        &self,
        headers: &'h HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<&'h str, WebhookError> {
        let id = header(headers, ID_HEADER)?;
        let timestamp: u64 = header(headers, TIMESTAMP_HEADER)?
            .trim()
            .parse()
            .map_err(|_| WebhookError::Timestamp)?;
        let signatures = header(headers, SIGNATURE_HEADER)?;
        let sent = UNIX_EPOCH + Duration::from_secs(timestamp);
        let skew = now
            .duration_since(sent)
            .unwrap_or_else(|early| early.duration());
        if skew > self.tolerance {
            return Err(WebhookError::Stale {
                skew,
                tolerance: self.tolerance,
            });
        }
        let candidates: Vec<Vec<u8>> = signatures
            .split_ascii_whitespace()
            .filter_map(|entry| entry.strip_prefix("v1,"))
            .filter_map(|encoded| BASE64.decode(encoded).ok())
            .collect();
        // `verify_slice` compares in constant time: a forger learns nothing from timing.
        let signed = self.secrets.iter().any(|secret| {
            let mac = secret.mac(id, timestamp, body);
            candidates
                .iter()
                .any(|candidate| mac.clone().verify_slice(candidate).is_ok())
        });
        if !signed {
            return Err(WebhookError::Signature);
        }
        let usable =
            !id.is_empty() && id.len() <= MAX_KEY_LEN && id.bytes().all(|b| b.is_ascii_graphic());
        if !usable {
            return Err(WebhookError::Id);
        }
        Ok(id)
    }
}

/// The one text value of header `name`.
fn header<'h>(headers: &'h HeaderMap, name: &'static str) -> Result<&'h str, WebhookError> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(value), None) => value.to_str().map_err(|_| WebhookError::Header(name)),
        _ => Err(WebhookError::Header(name)),
    }
}

impl WebhookError {
    /// The `reason` member of the problem answer.
    fn reason(&self) -> &'static str {
        match self {
            Self::Header(_) => "header_missing",
            Self::Timestamp => "timestamp_invalid",
            Self::Stale { .. } => "timestamp_out_of_tolerance",
            Self::Signature => "signature_mismatch",
            Self::Id => "id_invalid",
        }
    }
}

impl IntoResponse for WebhookError {
    fn into_response(self) -> Response {
        self.problem().into_response()
    }
}

impl WebhookError {
    /// The problem a delivery refused for this error is answered with.
    pub(crate) fn problem(&self) -> Problem {
        let detail = crate::problem::sentence(&self.to_string()).unwrap_or_default();
        let problem = match self {
            Self::Id => Problem::new(
                StatusCode::BAD_REQUEST,
                codes::WEBHOOK_ID_INVALID,
                "Webhook id invalid",
                format!("{detail} The delivery was verified but not processed."),
            ),
            _ => Problem::new(
                StatusCode::UNAUTHORIZED,
                codes::WEBHOOK_UNVERIFIED,
                "Webhook not verified",
                format!("{detail} Nothing was processed or stored."),
            ),
        };
        problem.with_reason(self.reason())
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const OTHER: &str = "whsec_c2VjcmV0LWFmdGVyLXJvdGF0aW9u";

    fn delivery(secret: &str, id: &str, timestamp: u64, body: &[u8]) -> HeaderMap {
        let signature = WebhookSecret::parse(secret)
            .unwrap()
            .sign(id, timestamp, body);
        let mut headers = HeaderMap::new();
        headers.insert(ID_HEADER, HeaderValue::from_str(id).unwrap());
        headers.insert(TIMESTAMP_HEADER, HeaderValue::from(timestamp));
        headers.insert(SIGNATURE_HEADER, HeaderValue::from_str(&signature).unwrap());
        headers
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// The reference vector of the Standard Webhooks test suite: the signed content and
    /// its encoding are the specification's, not only ours.
    #[test]
    fn verifies_the_specification_vector() {
        let body = br#"{"test": 2432232314}"#;
        let mut headers = HeaderMap::new();
        headers.insert(
            ID_HEADER,
            HeaderValue::from_static("msg_p5jXN8AQM9LWM0D4loKWxJek"),
        );
        headers.insert(TIMESTAMP_HEADER, HeaderValue::from_static("1614265330"));
        headers.insert(
            SIGNATURE_HEADER,
            HeaderValue::from_static("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="),
        );
        let secret = WebhookSecret::parse(SECRET).unwrap();
        assert_eq!(
            secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        let verifier = WebhookVerifier::new([SECRET]).unwrap();
        assert_eq!(
            verifier.verify_at(&headers, body, at(1_614_265_330)),
            Ok("msg_p5jXN8AQM9LWM0D4loKWxJek")
        );
    }

    #[test]
    fn accepts_a_signature_by_any_current_secret_among_several_entries() {
        let verifier = WebhookVerifier::new([SECRET, OTHER]).unwrap();
        let mut headers = delivery(OTHER, "msg_1", 1_000, b"{}");
        let signature = headers[SIGNATURE_HEADER].to_str().unwrap().to_owned();
        let both = format!("v1,bm90LWl0 v1a,ignored {signature}");
        headers.insert(SIGNATURE_HEADER, HeaderValue::from_str(&both).unwrap());
        assert_eq!(verifier.verify_at(&headers, b"{}", at(1_000)), Ok("msg_1"));
    }

    #[test]
    fn refuses_another_body_id_or_secret() {
        let verifier = WebhookVerifier::new([SECRET]).unwrap();
        let headers = delivery(SECRET, "msg_1", 1_000, b"{\"amount\":1}");
        assert_eq!(
            verifier.verify_at(&headers, b"{\"amount\":2}", at(1_000)),
            Err(WebhookError::Signature)
        );
        let mut renamed = headers.clone();
        renamed.insert(ID_HEADER, HeaderValue::from_static("msg_2"));
        assert_eq!(
            verifier.verify_at(&renamed, b"{\"amount\":1}", at(1_000)),
            Err(WebhookError::Signature)
        );
        let foreign = delivery(OTHER, "msg_1", 1_000, b"{\"amount\":1}");
        assert_eq!(
            verifier.verify_at(&foreign, b"{\"amount\":1}", at(1_000)),
            Err(WebhookError::Signature)
        );
    }

    #[test]
    fn refuses_a_timestamp_outside_the_tolerance_either_way() {
        let verifier = WebhookVerifier::new([SECRET])
            .unwrap()
            .tolerance(Duration::from_secs(60));
        let headers = delivery(SECRET, "msg_1", 1_000, b"{}");
        assert_eq!(verifier.verify_at(&headers, b"{}", at(1_060)), Ok("msg_1"));
        assert_eq!(verifier.verify_at(&headers, b"{}", at(940)), Ok("msg_1"));
        assert_eq!(
            verifier.verify_at(&headers, b"{}", at(1_061)),
            Err(WebhookError::Stale {
                skew: Duration::from_secs(61),
                tolerance: Duration::from_secs(60)
            })
        );
        assert!(matches!(
            verifier.verify_at(&headers, b"{}", at(939)),
            Err(WebhookError::Stale { .. })
        ));
    }

    #[test]
    fn names_a_missing_or_repeated_header_and_a_bad_timestamp() {
        let verifier = WebhookVerifier::new([SECRET]).unwrap();
        let headers = delivery(SECRET, "msg_1", 1_000, b"{}");
        for name in [ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER] {
            let mut missing = headers.clone();
            missing.remove(name);
            assert_eq!(
                verifier.verify_at(&missing, b"{}", at(1_000)),
                Err(WebhookError::Header(name))
            );
            let mut repeated = headers.clone();
            repeated.append(name, headers[name].clone());
            assert_eq!(
                verifier.verify_at(&repeated, b"{}", at(1_000)),
                Err(WebhookError::Header(name))
            );
        }
        let mut text = headers.clone();
        text.insert(TIMESTAMP_HEADER, HeaderValue::from_static("yesterday"));
        assert_eq!(
            verifier.verify_at(&text, b"{}", at(1_000)),
            Err(WebhookError::Timestamp)
        );
    }

    #[test]
    fn a_signed_id_that_cannot_be_a_key_is_refused_after_verification() {
        let verifier = WebhookVerifier::new([SECRET]).unwrap();
        let long = "m".repeat(MAX_KEY_LEN + 1);
        let headers = delivery(SECRET, &long, 1_000, b"{}");
        assert_eq!(
            verifier.verify_at(&headers, b"{}", at(1_000)),
            Err(WebhookError::Id)
        );
        let spaced = delivery(SECRET, "msg 1", 1_000, b"{}");
        assert_eq!(
            verifier.verify_at(&spaced, b"{}", at(1_000)),
            Err(WebhookError::Id)
        );
    }

    #[test]
    fn secrets_that_do_not_parse_are_named() {
        assert_eq!(
            WebhookVerifier::new([SECRET, "whsec_%%%"]).unwrap_err(),
            WebhookSecretError {
                position: 2,
                reason: "not valid base64"
            }
        );
        assert_eq!(
            WebhookVerifier::new(Vec::<String>::new())
                .unwrap_err()
                .position,
            0
        );
        assert_eq!(
            format!("{:?}", WebhookSecret::parse(SECRET).unwrap()),
            "WebhookSecret(..)"
        );
    }
}
