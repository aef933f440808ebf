//! One chaos run: a fresh Postgres database, demo instances on it, a fault proxy in
//! front of each, retrying clients through the proxies, then the count of handler
//! executions per payment from the demo's own records (its gateway logs every call in
//! `demo_gateway_calls`, deduplicated downstream or not).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use http::Method;
use idempotent_runtime::{Fingerprint, FingerprintMode, IdempotencyKey};
use sqlx::Connection;

use super::client::{self, Outcome, Payment, RetryPolicy};
use super::proxy::{self, FaultRates, ProxyStats};
use crate::gateway::DECLINED_AMOUNT;

/// Any error that ends a run early.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What to run.
#[derive(Debug, Clone)]
pub struct ChaosConfig {
    /// A Postgres URL whose user may create databases; the run makes its own.
    pub admin_url: String,
    /// Demo instances, each behind its own proxy.
    pub instances: usize,
    /// Payments to make.
    pub payments: usize,
    /// Payments in flight at once.
    pub concurrency: usize,
    /// The fake gateway's latency (how long each handler runs).
    pub gateway_latency: Duration,
    /// The proxies' faults.
    pub rates: FaultRates,
    /// The clients' retries.
    pub policy: RetryPolicy,
    /// The whole client phase must end within this.
    pub time_limit: Duration,
    /// Where the instances' logs go.
    pub log_dir: PathBuf,
}

/// The figures of a run.
#[derive(Debug)]
pub struct Report {
    /// What was run.
    pub config: ChaosConfig,
    /// The database the run made.
    pub database: String,
    /// How each payment ended for its client, in payment order.
    pub outcomes: Vec<Outcome>,
    /// Handler executions per payment, in payment order.
    pub executions: Vec<i64>,
    /// Connections the proxies accepted.
    pub connections: u64,
    /// Connections relayed both ways.
    pub passed: u64,
    /// Requests dropped before the server.
    pub dropped: u64,
    /// Connections cut in flight.
    pub cut_in_flight: u64,
    /// Answers lost.
    pub answer_lost: u64,
    /// Requests stalled.
    pub stalled: u64,
    /// Gateway calls whose downstream key no payment of this run derives.
    pub unattributed_calls: i64,
    /// What broke the guarantee, one line each.
    pub violations: Vec<String>,
    /// How long the run took.
    pub elapsed: Duration,
}

impl Report {
    /// No payment ran twice, every answered payment ran exactly once, and every `201`
    /// showed the charge the gateway recorded.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Runs the chaos check; `instance` builds the command of one demo instance (the
/// payments demo; `--addr`, `--database-url` and `--gateway-latency-ms` are appended).
pub async fn run(config: ChaosConfig, instance: &dyn Fn() -> Command) -> Result<Report, BoxError> {
    let database = format!("chaos_{:016x}", rand::random::<u64>());
    let mut admin = sqlx::PgConnection::connect(&config.admin_url).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE \"{database}\""
    )))
    .execute(&mut admin)
    .await?;
    let result = run_on(&config, &database, instance).await;
    // The database goes whatever happened; a run leaves nothing behind.
    let drop = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await;
    let report = result?;
    drop?;
    Ok(report)
}

async fn run_on(
    config: &ChaosConfig,
    database: &str,
    instance: &dyn Fn() -> Command,
) -> Result<Report, BoxError> {
    let started = Instant::now();
    let url = with_database(&config.admin_url, database);
    std::fs::create_dir_all(&config.log_dir)?;
    // One after another: each applies the migrations on the fresh database.
    let mut instances = Vec::new();
    for i in 0..config.instances {
        let log = config.log_dir.join(format!("instance-{i}.log"));
        instances.push(Instance::start(instance(), &url, config.gateway_latency, log).await?);
    }
    let stats = Arc::new(ProxyStats::default());
    let mut proxies = Vec::new();
    for instance in &instances {
        proxies.push(proxy::start(instance.addr, config.rates, stats.clone()).await?);
    }

    let run_id = format!("{:08x}", rand::random::<u32>());
    let payments: Vec<Payment> = (0..config.payments).map(|i| payment(&run_id, i)).collect();
    let http = reqwest::Client::builder()
        .no_proxy()
        // One connection per request: every request draws its own fault.
        .pool_max_idle_per_host(0)
        .build()?;
    let drive = futures_util::stream::iter(payments.iter().enumerate())
        .map(|(i, payment)| {
            let (http, proxies) = (&http, &proxies);
            async move { client::pay(http, proxies, i, payment, config.policy).await }
        })
        .buffered(config.concurrency)
        .collect::<Vec<Outcome>>();
    let outcomes = tokio::time::timeout(config.time_limit, drive)
        .await
        .map_err(|_| format!("the payments did not finish within {:?}", config.time_limit))?;

    // Stalled requests are still on their way to the servers: let them land, then stop
    // the instances gracefully, which waits for their running handlers.
    let quiet = Instant::now();
    while ProxyStats::get(&stats.active) > 0 && quiet.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for instance in &mut instances {
        instance.stop().await;
    }

    let pool = sqlx::PgPool::connect(&url).await?;
    let calls: Vec<(String, i64)> = sqlx::query_as(
        "SELECT downstream_key, COUNT(*) FROM demo_gateway_calls GROUP BY downstream_key",
    )
    .fetch_all(&pool)
    .await?;
    let charges: Vec<(String, String)> =
        sqlx::query_as("SELECT downstream_key, id FROM demo_charges")
            .fetch_all(&pool)
            .await?;
    pool.close().await;
    let mut calls: HashMap<String, i64> = calls.into_iter().collect();
    let charges: HashMap<String, String> = charges.into_iter().collect();

    let mut violations = Vec::new();
    let mut executions = Vec::with_capacity(payments.len());
    for (payment, outcome) in payments.iter().zip(&outcomes) {
        let downstream = downstream_key(payment);
        let count = calls.remove(&downstream).unwrap_or(0);
        executions.push(count);
        let key = &payment.idempotency_key;
        match outcome.status {
            Some(200..=499) if count != 1 => violations.push(format!(
                "{key}: answered {:?} but its handler ran {count} times",
                outcome.status
            )),
            _ if count > 1 => violations.push(format!(
                "{key}: no answer, and its handler ran {count} times"
            )),
            _ => {}
        }
        if outcome.status == Some(201) {
            let answered = serde_json::from_str::<serde_json::Value>(&outcome.body)
                .ok()
                .and_then(|body| body["id"].as_str().map(str::to_owned));
            if answered.as_ref() != charges.get(&downstream) {
                violations.push(format!(
                    "{key}: answered with payment {answered:?}, the gateway recorded {:?}",
                    charges.get(&downstream)
                ));
            }
        }
    }
    let unattributed_calls: i64 = calls.values().sum();
    if unattributed_calls > 0 {
        violations.push(format!(
            "{unattributed_calls} gateway calls with downstream keys no payment derives"
        ));
    }
    Ok(Report {
        config: config.clone(),
        database: database.to_owned(),
        outcomes,
        executions,
        connections: ProxyStats::get(&stats.connections),
        passed: ProxyStats::get(&stats.passed),
        dropped: ProxyStats::get(&stats.dropped),
        cut_in_flight: ProxyStats::get(&stats.cut_in_flight),
        answer_lost: ProxyStats::get(&stats.answer_lost),
        stalled: ProxyStats::get(&stats.stalled),
        unattributed_calls,
        violations,
        elapsed: started.elapsed(),
    })
}

/// Payment `i` of a run: alternating callers, every tenth one declined (`402`, recorded
/// by the gateway like a charge).
fn payment(run_id: &str, i: usize) -> Payment {
    let amount = if i % 10 == 7 {
        DECLINED_AMOUNT
    } else {
        1_000 + i as i64
    };
    Payment {
        api_key: ["sk_test_alice", "sk_test_bob"][i % 2],
        idempotency_key: format!("chaos-{run_id}-{i:05}"),
        body: format!(r#"{{"amount": {amount}, "currency": "EUR"}}"#),
    }
}

/// The gateway key the demo's handler derives for `payment`: `key.derive("authorise")` of
/// the claimed key (scope = the caller's account; raw fingerprint, the default).
fn downstream_key(payment: &Payment) -> String {
    let account = match payment.api_key {
        "sk_test_alice" => "acct_alice",
        _ => "acct_bob",
    };
    let fingerprint = Fingerprint::compute(
        FingerprintMode::Raw,
        &Method::POST,
        "/payments",
        None,
        payment.body.as_bytes(),
    );
    IdempotencyKey::for_request(
        account.to_owned(),
        payment.idempotency_key.clone(),
        fingerprint,
    )
    .derive("authorise")
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        let requests: u32 = self.outcomes.iter().map(|o| o.attempts).sum();
        let max_attempts = self.outcomes.iter().map(|o| o.attempts).max().unwrap_or(0);
        let transport: u32 = self.outcomes.iter().map(|o| o.transport_errors).sum();
        let in_progress: u32 = self.outcomes.iter().map(|o| o.in_progress).sum();
        let unavailable: u32 = self.outcomes.iter().map(|o| o.unavailable).sum();
        let replayed = self.outcomes.iter().filter(|o| o.replayed).count();
        let mut answers: BTreeMap<String, usize> = BTreeMap::new();
        for outcome in &self.outcomes {
            let label = outcome
                .status
                .map_or("no answer".to_owned(), |s| s.to_string());
            *answers.entry(label).or_default() += 1;
        }
        let mut runs: BTreeMap<i64, usize> = BTreeMap::new();
        for &count in &self.executions {
            *runs.entry(count).or_default() += 1;
        }
        let total: i64 = self.executions.iter().sum();
        writeln!(
            f,
            "chaos: {} payments demo instances on one fresh Postgres database ({}), a fault proxy in front of each",
            c.instances, self.database
        )?;
        writeln!(
            f,
            "payments:        {} ({} at a time; every 10th declined with 402)",
            c.payments, c.concurrency
        )?;
        writeln!(
            f,
            "requests sent:   {requests} ({:.2} per payment, at most {max_attempts})",
            f64::from(requests) / c.payments.max(1) as f64
        )?;
        writeln!(f, "connections:     {}", self.connections)?;
        writeln!(
            f,
            "faults injected: {} dropped before the server, {} cut in flight, {} answers lost, {} stalled past the client timeout ({} connections passed)",
            self.dropped, self.cut_in_flight, self.answer_lost, self.stalled, self.passed
        )?;
        writeln!(
            f,
            "client saw:      {transport} transport errors/timeouts, {in_progress} × 409 in progress, {unavailable} × 429/502/503/504; {replayed} final answers were replays"
        )?;
        for (index, outcome) in self.outcomes.iter().enumerate() {
            if outcome.status.is_none() {
                writeln!(
                    f,
                    "no answer:       payment {index} after {} attempts: {}",
                    outcome.attempts,
                    outcome.history.join(", ")
                )?;
            }
        }
        let answers: Vec<String> = answers.iter().map(|(s, n)| format!("{s}: {n}")).collect();
        writeln!(f, "final answers:   {}", answers.join(", "))?;
        let runs: Vec<String> = runs
            .iter()
            .map(|(count, n)| format!("{n} payments ran {count}×"))
            .collect();
        writeln!(
            f,
            "executions:      {} ({total} handler executions in the gateway's call log, {} unattributed)",
            runs.join(", "),
            self.unattributed_calls
        )?;
        writeln!(f, "time:            {:.1} s", self.elapsed.as_secs_f64())?;
        if self.violations.is_empty() {
            write!(
                f,
                "result:          OK: every answered payment ran exactly once, none ran twice"
            )
        } else {
            writeln!(
                f,
                "result:          FAILED, {} violations:",
                self.violations.len()
            )?;
            for violation in self.violations.iter().take(20) {
                writeln!(f, "  {violation}")?;
            }
            Ok(())
        }
    }
}

/// A demo instance process, killed on drop.
struct Instance {
    child: Child,
    addr: SocketAddr,
}

impl Instance {
    async fn start(
        mut command: Command,
        url: &str,
        latency: Duration,
        log: PathBuf,
    ) -> Result<Instance, BoxError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let child = command
            .arg("--addr")
            .arg(addr.to_string())
            .arg("--database-url")
            .arg(url)
            .arg("--gateway-latency-ms")
            .arg(latency.as_millis().to_string())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        let mut instance = Instance { child, addr };
        for _ in 0..600 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok(instance);
            }
            if let Some(status) = instance.child.try_wait()? {
                return Err(format!(
                    "a demo instance exited at startup ({status}); see {}",
                    log.display()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!("a demo instance did not listen on {addr} within 30 s").into())
    }

    /// SIGTERM, so the demo drains its running handlers; SIGKILL after 40 s.
    async fn stop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        for _ in 0..400 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `url` pointing at database `name` instead.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[scheme_end..].find('/') {
        Some(slash) => &base[..scheme_end + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{name}?{query}"),
        None => format!("{base}/{name}"),
    }
}
