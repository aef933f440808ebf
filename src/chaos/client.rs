//! A retrying client of the kind payment services use: a timeout per attempt,
//! exponential backoff with full jitter, retries on connection errors and timeouts, on
//! `409` (after its `Retry-After`) and on `503`/`502`/`504`/`429`, the same
//! `Idempotency-Key` on every attempt of one payment, and each attempt sent to the next
//! instance, so retries spread across them.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::Rng;

/// How the client retries.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// How long one attempt may take before the client gives up on it.
    pub attempt_timeout: Duration,
    /// Attempts per payment, the first included.
    pub max_attempts: u32,
    /// The first backoff step; doubled per attempt up to `max_backoff`.
    pub base_backoff: Duration,
    /// The longest backoff step.
    pub max_backoff: Duration,
    /// The longest `Retry-After` the client honours (longer ones are cut to this).
    pub max_retry_after: Duration,
}

/// One payment to make.
#[derive(Debug, Clone)]
pub struct Payment {
    /// The caller's demo API key (its idempotency scope).
    pub api_key: &'static str,
    /// The key sent on every attempt of this payment.
    pub idempotency_key: String,
    /// The JSON body of `POST /payments`.
    pub body: String,
}

/// How a payment ended for the client.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The final answer's status, or `None` when every attempt failed or was retryable.
    pub status: Option<u16>,
    /// The final answer's body.
    pub body: String,
    /// Requests sent.
    pub attempts: u32,
    /// `409`s seen.
    pub in_progress: u32,
    /// Transport failures (connection errors and timeouts) seen.
    pub transport_errors: u32,
    /// `429`, `502`, `503` and `504` answers seen (retried like a transport failure).
    pub unavailable: u32,
    /// What each attempt met, in order (`200`, `409`, `timeout`, `connect`, …), so a
    /// payment left without an answer can be read back attempt by attempt.
    pub history: Vec<String>,
    /// Answers replayed (`Idempotent-Replayed: true`).
    pub replayed: bool,
}

/// Makes `payment` through `proxies`, starting at `first`, retrying as the policy says.
pub async fn pay(
    http: &reqwest::Client,
    proxies: &[SocketAddr],
    first: usize,
    payment: &Payment,
    policy: RetryPolicy,
) -> Outcome {
    let mut outcome = Outcome {
        status: None,
        body: String::new(),
        attempts: 0,
        in_progress: 0,
        transport_errors: 0,
        unavailable: 0,
        history: Vec::new(),
        replayed: false,
    };
    for attempt in 0..policy.max_attempts {
        let proxy = proxies[(first + attempt as usize) % proxies.len()];
        outcome.attempts += 1;
        let started = Instant::now();
        let sent = http
            .post(format!("http://{proxy}/payments"))
            .header("authorization", format!("Bearer {}", payment.api_key))
            .header("idempotency-key", &payment.idempotency_key)
            .header("content-type", "application/json")
            .body(payment.body.clone())
            .timeout(policy.attempt_timeout)
            .send()
            .await;
        let wait = match sent {
            Err(error) => {
                outcome.transport_errors += 1;
                outcome.history.push(transport_failure(&error).to_owned());
                backoff(policy, attempt)
            }
            Ok(response) => {
                let status = response.status().as_u16();
                let retry_after = response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(|s| Duration::from_secs(s).min(policy.max_retry_after));
                let replayed = response
                    .headers()
                    .get("idempotent-replayed")
                    .is_some_and(|v| v == "true");
                let body = match tokio::time::timeout(
                    policy.attempt_timeout.saturating_sub(started.elapsed()),
                    response.text(),
                )
                .await
                {
                    Ok(Ok(body)) => body,
                    // The answer was cut while its body was read: a transport failure.
                    _ => {
                        outcome.transport_errors += 1;
                        outcome.history.push(format!("{status} cut"));
                        tokio::time::sleep(backoff(policy, attempt)).await;
                        continue;
                    }
                };
                outcome.history.push(status.to_string());
                match status {
                    409 => {
                        outcome.in_progress += 1;
                        retry_after.unwrap_or_else(|| backoff(policy, attempt)) + jitter(100)
                    }
                    429 | 502 | 503 | 504 => {
                        outcome.unavailable += 1;
                        retry_after.unwrap_or_else(|| backoff(policy, attempt)) + jitter(100)
                    }
                    // Anything else is the payment's answer: 2xx, or a 4xx/500 that a
                    // retry would only replay.
                    _ => {
                        outcome.status = Some(status);
                        outcome.body = body;
                        outcome.replayed = replayed;
                        return outcome;
                    }
                }
            }
        };
        if attempt + 1 < policy.max_attempts {
            tokio::time::sleep(wait).await;
        }
    }
    outcome
}

/// A short name for why an attempt got no answer.
fn transport_failure(error: &reqwest::Error) -> &'static str {
    if error.is_timeout() {
        "timeout"
    } else if error.is_connect() {
        "connect"
    } else {
        "transport"
    }
}

/// Full jitter: a random wait up to `base × 2^attempt`, capped.
fn backoff(policy: RetryPolicy, attempt: u32) -> Duration {
    let ceiling = policy
        .base_backoff
        .saturating_mul(1 << attempt.min(16))
        .min(policy.max_backoff);
    let ceiling_ms = ceiling.as_millis().max(1) as u64;
    Duration::from_millis(rand::rng().random_range(0..=ceiling_ms))
}

fn jitter(max_ms: u64) -> Duration {
    Duration::from_millis(rand::rng().random_range(0..=max_ms))
}
