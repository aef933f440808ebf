//! Per-handler policy: what `#[idempotent(...)]` writes down for one handler.

use std::time::Duration;

use crate::fingerprint::FingerprintMode;

/// What happens to the claim when the handler answers with a 5xx status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnServerError {
    /// Delete the claim so a retry runs the handler again (the default): a 5xx usually
    /// means the operation did not happen.
    #[default]
    Release,
    /// Store the 5xx and replay it like any other answer.
    Store,
}

/// The policy of one idempotent handler. Unset durations fall back to the engine's
/// defaults ([`crate::engine::IdempotencyBuilder::default_ttl`], `default_lease`).
///
/// All setters are `const fn` so the attribute macro can build a `const` config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HandlerConfig {
    /// The handler's name (the attribute sets `module::function`): keeps its own
    /// `Retry-After` estimate.
    pub name: Option<&'static str>,
    /// How long a key is remembered after it was first claimed.
    pub ttl: Option<Duration>,
    /// How long a claim stays owned without a heartbeat.
    pub lease: Option<Duration>,
    /// How long the handler (and its response body) may take before it is interrupted.
    pub max_duration: Option<Duration>,
    /// What a 5xx answer does to the claim.
    pub on_server_error: OnServerError,
    /// How the request is fingerprinted.
    pub fingerprint: FingerprintMode,
    /// Response headers (lower-case names) not to store and replay, besides those that
    /// never are ([`crate::engine::NEVER_REPLAYED`]).
    pub excluded_headers: &'static [&'static str],
    /// Whether a request without the key header runs the handler unprotected instead of
    /// `400` (`key = optional`, rollout). Informational for the attribute, whose extractor
    /// enforces it; the policy [`IdempotencyLayer`](crate::layer::IdempotencyLayer) applies and
    /// the one the published OpenAPI document states.
    pub key_optional: bool,
    /// How long a duplicate that finds the original still running waits for its outcome
    /// before answering `409` (`None`: the engine's default, itself off unless set with
    /// [`crate::engine::IdempotencyBuilder::default_wait`]).
    pub wait: Option<Duration>,
}

impl HandlerConfig {
    /// The defaults: engine TTL and lease, release on 5xx, raw fingerprint, key required.
    pub const fn new() -> Self {
        Self {
            name: None,
            ttl: None,
            lease: None,
            max_duration: None,
            on_server_error: OnServerError::Release,
            fingerprint: FingerprintMode::Raw,
            excluded_headers: &[],
            key_optional: false,
            wait: None,
        }
    }

    /// Names the handler.
    pub const fn name(mut self, name: &'static str) -> Self {
        self.name = Some(name);
        self
    }

    /// Sets the TTL.
    pub const fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Sets the lease.
    pub const fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Sets the maximum duration.
    pub const fn max_duration(mut self, max: Duration) -> Self {
        self.max_duration = Some(max);
        self
    }

    /// Sets the 5xx policy.
    pub const fn on_server_error(mut self, policy: OnServerError) -> Self {
        self.on_server_error = policy;
        self
    }

    /// Sets the fingerprint mode.
    pub const fn fingerprint(mut self, mode: FingerprintMode) -> Self {
        self.fingerprint = mode;
        self
    }

    /// Sets the response headers (lower-case names) not to store and replay.
    pub const fn exclude_headers(mut self, names: &'static [&'static str]) -> Self {
        self.excluded_headers = names;
        self
    }

    /// Makes the key optional: a request without it runs the handler unprotected.
    pub const fn key_optional(mut self) -> Self {
        self.key_optional = true;
        self
    }

    /// Sets how long a duplicate that finds the original still running waits for its
    /// outcome: it then gets the replay; if the original is still running at the end,
    /// `409` + `Retry-After` as without a wait; if the original released its claim (a
    /// 5xx, a panic), the waiter claims the key and runs the handler itself. A zero wait
    /// turns waiting off for this handler even when the engine has a default.
    ///
    /// The engine cuts a wait longer than the handler's maximum duration (its own, or the
    /// engine's [default](crate::engine::IdempotencyBuilder::default_max_duration)) to it:
    /// by then the original has an outcome, so a duplicate never waits longer than the
    /// handler may run. The attribute refuses such a wait at compile time only when both
    /// are written in it (`#[idempotent(max_duration = "30s", wait = "1m")]`).
    pub const fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }
}

impl Default for HandlerConfig {
    fn default() -> Self {
        Self::new()
    }
}
