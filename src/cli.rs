//! Command-line flags shared by the demo binaries, each with an environment fallback.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;

/// Flags of the demo APIs.
#[derive(Debug, Clone, Parser)]
#[command(about = "An idempotent demo API", version)]
pub struct DemoArgs {
    /// Address to listen on.
    #[arg(long, env = "ADDR", default_value = "127.0.0.1:3000")]
    pub addr: SocketAddr,

    /// `sqlite://file.db` (created if missing) or `postgres://user@host/db`.
    #[arg(long, env = "DATABASE_URL", default_value = "sqlite://payments.db")]
    pub database_url: String,

    /// Latency of the fake payment gateway, in milliseconds.
    #[arg(long, env = "GATEWAY_LATENCY_MS", default_value_t = 50)]
    pub gateway_latency_ms: u64,

    /// The engine's default lease (e.g. `30s`): how long a claim stays owned without a
    /// heartbeat, so how soon a crashed instance's request can be retried.
    #[arg(long, env = "IDEMPOTENCY_LEASE", default_value = "30s", value_parser = parse_duration)]
    pub lease: Duration,

    /// The engine's default TTL (e.g. `24h`): how long a key is remembered. Shorten it to
    /// watch an expired key run as new.
    #[arg(long, env = "IDEMPOTENCY_TTL", default_value = "24h", value_parser = parse_duration)]
    pub ttl: Duration,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|err| err.to_string())
}

impl DemoArgs {
    /// The fake gateway's latency.
    pub fn gateway_latency(&self) -> Duration {
        Duration::from_millis(self.gateway_latency_ms)
    }
}
