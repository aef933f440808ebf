//! The engine's published policy: the defaults a handler gets when it sets nothing, and
//! the response headers that are never stored or replayed.

use std::time::Duration;

/// The header marking a replayed response.
pub use idempotent_policy::REPLAYED_HEADER;

/// Response headers never stored or replayed: they describe one response or one
/// connection, not the operation (`Date`, `Set-Cookie`, hop-by-hop headers; any header a
/// `Connection` field names is hop-by-hop too). `Content-Length` is recomputed for the
/// replayed body. Every other header is replayed as the handler sent it, unless the
/// handler excludes it ([`HandlerConfig::exclude_headers`](crate::config::HandlerConfig::exclude_headers)).
/// The reason for each is in [`NEVER_REPLAYED_BECAUSE`], the list the attribute macro
/// checks `exclude_headers` against.
pub use idempotent_policy::NEVER_REPLAYED;
pub use idempotent_policy::NEVER_REPLAYED_BECAUSE;

/// Default TTL: Stripe's 24 hours.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Default lease: 30 seconds, renewed every third of it while the handler runs.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default maximum duration of a handler and its response body: 5 minutes.
pub const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(5 * 60);
/// Default cap on a stored response body: 1 MiB.
pub const DEFAULT_MAX_STORED_BODY: usize = 1024 * 1024;
