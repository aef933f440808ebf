//! [`RedisStore`]: the store for many instances sharing one Redis (or Valkey) primary, or
//! one Redis Cluster.
//!
//! Every instance of the app talks to the same Redis, so a retry that lands on another
//! instance still finds the first attempt's claim or recorded response. Redis is fast and
//! many teams already run it; what it trades for that is durability, so read
//! [Durability](#durability-what-a-crash-or-a-failover-loses) before choosing it for
//! payments.
//!
//! # One record, one hash, four scripts
//!
//! A record is one Redis hash with the fields `state` (`in_progress` / `completed`),
//! `fp` (the 32-byte fingerprint digest), `fpv` (its version), `token`,
//! `lease_expires_at`, `expires_at` and `created_at` (milliseconds since the Unix epoch
//! on the server's clock), `version` (a decimal `u64` every write changes), `steps` while
//! in progress and once a step is recorded (the concatenation of [`encode_step`] in
//! recording order, see [`RecordedStep`]; absent means none), and once completed `status`,
//! `headers` (encoded with [`encode_headers`]) and `body` (absent when the body was over
//! the engine's cap; present and empty for an empty body).
//!
//! Its key is `<prefix>:{<scope length>:<scope>:<key>}` (prefix `idempotent` unless
//! [`RedisStoreBuilder::key_prefix`] says otherwise). The braces are a Redis Cluster hash
//! tag over scope and key, so every record maps to one slot and every script touches one
//! key: on a cluster each operation runs whole on the primary owning that slot. See
//! [`RedisStore::record_key`].
//!
//! The store is the engine's protocol ([`Fenced`]) over [`RedisRecords`], a fenced record
//! register: its scripts insert a record unless the key has one (answering the one it
//! has), read one, apply a change if the record is still at the version the engine read
//! (bumping it; else answering the record as it is now), and delete one at a version.
//! Each answers with the server's `TIME`. Which record a claim takes over, which steps
//! survive, whether a release keeps a record and what operators see are decided by the
//! engine, once for every store. Scripts are sent as `EVALSHA` (the source only when the
//! server does not know the script yet: two more round trips, once per script and
//! server).
//!
//! Round trips: a fresh key, a duplicate (replay, `409`, `422`), a renewal, a step and a
//! completion are one each; a takeover and a release are two (read, then write). The
//! store has no change notifications, so waiting duplicates poll.
//!
//! # Upgrading from records without a `version`
//!
//! Records written before the store kept a `version` are read as they are: their version
//! is derived, by the scripts, from the fields the previous release's scripts change
//! (state, token, times and the length of the steps), so the first write through this
//! release adds the field and a write by an instance of the previous release still
//! running during a rolling upgrade changes the version the engine compares. No
//! migration is needed.
//!
//! # One clock: the Redis server's
//!
//! Scripts read the time with `TIME` on the server, so instances whose clocks drift still
//! agree on every expiry and lease. (Scripts are replicated by their effects — the
//! default since Redis 5, the only mode since 7 — which is what makes `TIME` allowed in a
//! script that writes.)
//!
//! # Expiry and `purge_expired`
//!
//! Each record carries a Redis expiry (`PEXPIREAT`) at the later of its `expires_at` and
//! its lease's end, set when a claim or a renewal moves them, so Redis never drops a
//! record the engine could still need, and deletes expired records on its own: **no
//! sweeper is needed**. [`Store::purge_expired`] still works: it walks the prefix with
//! `SCAN`, reads each record, and deletes those the engine finds expired but Redis has
//! not yet dropped; it returns how many *it* deleted, so on a healthy server it returns
//! 0. On a cluster it walks every primary in turn (listed with `CLUSTER SLOTS`); a
//! primary that is down fails the call. Each call walks the whole keyspace (`SCAN`
//! filters by pattern on the server), so do not run `Idempotency::spawn_sweeper` against
//! a large Redis.
//!
//! # Durability: what a crash or a failover loses
//!
//! Redis acknowledges a write once it is in memory. What survives depends on the server's
//! persistence settings:
//!
//! | setting | a crash of the Redis process | a crash of the machine (power, kernel) |
//! |---|---|---|
//! | AOF, `appendfsync always` | nothing acknowledged is lost | nothing acknowledged is lost (one fsync per write) |
//! | AOF, `appendfsync everysec` (the AOF default) | nothing (written before the reply) | the last 1–2 seconds of writes |
//! | RDB snapshots only (Redis's default `save` rules) | everything since the last snapshot (minutes; up to an hour on a quiet server) | the same |
//! | no persistence | every record | every record |
//!
//! What a lost write means for the API:
//!
//! - **A lost completed record** (the response was sent, the record is gone or back to
//!   `in_progress`): the client's retry is a new request, or a takeover once the lease
//!   ran out, and **the handler runs again**. Send derived downstream keys
//!   (`IdempotencyKey::derive`) to payment providers so that their own idempotency
//!   catches the second charge.
//! - **A lost claim**: a duplicate arriving after the loss claims the key too, and both
//!   run.
//!
//! **Failover.** Replication is asynchronous: the primary answers before any replica has
//! the write. When a replica is promoted (Sentinel, Cluster, a managed service), the
//! writes it had not received are gone — an acknowledged claim or completion may vanish,
//! with the consequences above (duplicates can run). `WAIT` narrows that window but does
//! not close it, and the store does not issue it. While the primary is unreachable every
//! operation fails with [`StoreError::Redis`] and requests get `503`, never an
//! unprotected run. The connection manager reconnects to the address it was given, so
//! give it one that follows the primary (a Sentinel-managed or proxy address). The new
//! primary's clock takes over: a skew between the two shifts leases and TTLs by that
//! much. Scripts are loaded again automatically on the new primary.
//!
//! **Cluster failover.** On a Redis Cluster the same holds per shard, and the store's
//! cluster tests show it on a local cluster (three primaries, a replica each,
//! `cluster-node-timeout` 2 s) by killing a primary with `SIGKILL`:
//!
//! - Records on the other primaries keep answering throughout.
//! - Operations on the dead primary's slots fail with [`StoreError::Redis`] — the
//!   engine answers `503` problem+json and the handler does not run — until its replica
//!   is promoted, which takes the node timeout plus an election (with Redis's default
//!   `cluster-node-timeout` of 15 s, more than 15 s). The client retries each operation
//!   a few times within about a second ([`CLUSTER_RETRIES`]) and follows the promotion
//!   by itself; a longer outage reaches the caller as those errors.
//! - A completed record the replica had received is replayed by the new primary.
//! - **A completion the replica had not received is lost**: replication is asynchronous,
//!   so the primary acknowledges the completion (and the response goes out) before the
//!   replica has it. The retry then finds no record, claims the key afresh and **the
//!   handler runs again** (a claim lost this way lets a duplicate run too). The window
//!   is the replication lag: short on a healthy link, as long as the outage when the
//!   replica's link is down, since such a replica can still be promoted (within
//!   `cluster-replica-validity-factor`).
//!
//! **Eviction.** Every record has an expiry, so `volatile-*` eviction policies evict
//! records as readily as `allkeys-*` ones do, and an evicted record is a lost record. Run
//! the store on a Redis with `maxmemory-policy noeviction` (a full Redis then refuses
//! claims: `503`). [`RedisStore::connect`] logs a warning when the server says otherwise.
//!
//! Need "never twice" even across crashes? Use `PostgresStore` with synchronous commit
//! (and synchronous replication for failover), or its transactional unit of work.
//!
//! # Versions and topologies
//!
//! Requires Redis 5.0 or newer (scripts replicated by effects), or any Valkey; tested on
//! Redis 7.0, standalone and as a Redis Cluster. One store type serves both, through a
//! [`RedisConnection`]:
//!
//! - **One server**: [`RedisStore::connect`] with a `redis://` URL, or
//!   [`RedisStoreBuilder::from_connection_manager`]; a [`ConnectionManager`] talks to a
//!   standalone server or the primary behind a Sentinel-aware or proxy address.
//! - **A Redis Cluster**: [`RedisStore::connect_cluster`] with seed node URLs, or
//!   [`RedisStore::connect`] with `redis+cluster://host:port[,host:port…]`, or
//!   [`RedisStoreBuilder::from_cluster_connection`]; the `redis` crate's cluster client
//!   routes each script to the primary owning its record's slot and follows `MOVED`,
//!   `ASK` and failovers. Replicas are never read: every operation writes or must see
//!   the latest write. Cluster mode has one database, so a URL's `/db` must be `0`.

use std::sync::Arc;
use std::time::Duration;

use redis::RedisResult;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;

use super::redact::{is_secret_param, redact_url};
use super::{Forward, Store, StoreError};
#[cfg(doc)]
use super::{RecordedStep, encode_headers, encode_step};
use crate::fenced::Fenced;

mod connection;
mod keys;
mod records;
mod scripts;

pub use connection::RedisConnection;
pub use records::RedisRecords;

use keys::{DEFAULT_PREFIX, KeyLayout};

/// Each connection attempt gives up after this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A command without an answer after this long fails (the engine's own store timeout
/// usually answers first). Generous enough for a 1 MiB response on a busy server.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection attempt that fails is retried this often, backing off exponentially
/// from 100 ms: long enough to ride out a server restarting, short enough that a wrong
/// URL fails `connect` within a second or so. (While the store runs, every operation that
/// finds the connection broken starts a new round of attempts.)
const CONNECT_RETRIES: usize = 3;

/// The location `Debug` and errors name for a store on an app's own connection manager.
const APP_CONNECTION: &str = "redis (an app's connection manager)";

/// The location `Debug` and errors name for a store on an app's own cluster connection.
const APP_CLUSTER_CONNECTION: &str = "redis cluster (an app's cluster connection)";

/// The URL scheme that names a cluster to [`RedisStoreBuilder::connect`] (with `rediss`
/// for TLS): `redis+cluster://host:port[,host:port…]`.
const CLUSTER_SCHEME: &str = "redis+cluster";

/// How often the cluster client retries a command that met a moved slot, a node it could
/// not reach or a cluster still electing a new primary, waiting a random time from
/// [`CLUSTER_RETRY_MIN_WAIT_MS`] up to at most [`CLUSTER_RETRY_MAX_WAIT_MS`] between
/// tries: a redirection or a brief outage is ridden out, a failover that takes seconds
/// fails the operation (`503`) rather than holding the request.
const CLUSTER_RETRIES: u32 = 6;
const CLUSTER_RETRY_MIN_WAIT_MS: u64 = 100;
const CLUSTER_RETRY_MAX_WAIT_MS: u64 = 1000;

/// A [`Store`] on Redis or Valkey, for many instances sharing one server or one Redis
/// Cluster (see the module docs for the guarantees and what a crash or failover loses).
///
/// Cheap to clone: clones share the connection.
///
/// ```no_run
/// use idempotent_runtime::store::RedisStore;
///
/// # async fn demo() -> Result<(), idempotent_runtime::StoreError> {
/// // Keys `idempotent:{…}`:
/// let store = RedisStore::connect("redis://127.0.0.1:6379/").await?;
/// // Or under a prefix of your own:
/// let store = RedisStore::builder()
///     .key_prefix("payments-idem")
///     .connect("redis://:secret@redis.internal:6379/0")
///     .await?;
/// assert_eq!(store.key_prefix(), "payments-idem");
/// // A Redis Cluster, through one or more of its nodes:
/// let store = RedisStore::connect("redis+cluster://10.0.0.1:6379,10.0.0.2:6379/").await?;
/// let store = RedisStore::connect_cluster(["redis://10.0.0.1:6379/"]).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    /// The protocol over the records; shared by clones, so that an owner's next write
    /// knows the version of its last one whichever clone makes it.
    fenced: Arc<Fenced<RedisRecords>>,
    /// Where the store connects (password redacted), for `Debug`.
    location: Arc<str>,
}

/// Configures a [`RedisStore`]: [`RedisStore::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisStoreBuilder {
    prefix: String,
}

impl RedisStoreBuilder {
    /// Keys start with `prefix` followed by `:` (default `idempotent`). Apps or
    /// environments that share a Redis use different prefixes. A prefix with `{` or `}` is
    /// refused when the store is built: the record's hash tag must be the first braces in
    /// its key.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Connects to the Redis at `url` (`redis://[user:password@]host[:port][/db]`,
    /// `rediss://` needs a TLS feature of the `redis` crate), or to a Redis Cluster when
    /// the scheme is `redis+cluster://[user:password@]host:port[,host:port…]`: each
    /// `host:port` is a seed node, as in [`connect_cluster`](Self::connect_cluster).
    ///
    /// Fails with [`StoreError::Open`] — naming the URL with its password redacted — when
    /// the URL is invalid, the prefix is refused or the server cannot be reached.
    pub async fn connect(self, url: &str) -> Result<RedisStore, StoreError> {
        if let Some(seeds) = cluster_seeds(url) {
            return match seeds {
                Ok(seeds) => self.connect_cluster(seeds).await,
                Err(reason) => Err(StoreError::Open {
                    location: "<invalid redis+cluster URL>".to_owned(),
                    reason,
                }),
            };
        }
        let location = redact_url(url);
        let secrets = url_secrets(url);
        let open_error = |reason: String| StoreError::Open {
            location: location.clone(),
            reason: scrub(reason, &secrets),
        };
        let keys = KeyLayout::new(&self.prefix).map_err(open_error)?;
        let client = redis::Client::open(url).map_err(|e| open_error(e.to_string()))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(CONNECT_RETRIES);
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| open_error(e.to_string()))?;
        let mut conn = RedisConnection::Node(conn);
        warn_unless_noeviction(&mut conn, &location).await;
        Ok(RedisStore::with_parts(conn, keys, location))
    }

    /// Connects to a Redis Cluster through `nodes`, the URLs of one or more of its nodes
    /// (`redis://[user:password@]host:port`; the client learns every other node from them,
    /// so one reachable seed is enough, and more seeds ride out a seed that is down).
    ///
    /// Every operation goes to the primary owning its record's slot; `purge_expired`
    /// visits every primary. Fails with [`StoreError::Open`] — naming the seeds with their
    /// passwords redacted — when a URL is invalid, the prefix is refused or no seed
    /// answers as a healthy cluster node.
    pub async fn connect_cluster<I, S>(self, nodes: I) -> Result<RedisStore, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nodes: Vec<String> = nodes.into_iter().map(|n| n.as_ref().to_owned()).collect();
        let location = format!(
            "{CLUSTER_SCHEME} [{}]",
            nodes
                .iter()
                .map(|n| redact_url(n))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let secrets: Vec<String> = nodes.iter().flat_map(|n| url_secrets(n)).collect();
        let open_error = |reason: String| StoreError::Open {
            location: location.clone(),
            reason: scrub(reason, &secrets),
        };
        let keys = KeyLayout::new(&self.prefix).map_err(open_error)?;
        if nodes.is_empty() {
            return Err(open_error("no cluster node given".to_owned()));
        }
        let client = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
            .connection_timeout(CONNECT_TIMEOUT)
            .response_timeout(RESPONSE_TIMEOUT)
            .retries(CLUSTER_RETRIES)
            .min_retry_wait(CLUSTER_RETRY_MIN_WAIT_MS)
            .max_retry_wait(CLUSTER_RETRY_MAX_WAIT_MS)
            .build()
            .map_err(|e| open_error(e.to_string()))?;
        let conn = client
            .get_async_connection()
            .await
            .map_err(|e| open_error(e.to_string()))?;
        let mut conn = RedisConnection::Cluster(conn);
        warn_unless_noeviction(&mut conn, &location).await;
        Ok(RedisStore::with_parts(conn, keys, location))
    }

    /// A store on a connection manager the app already has.
    ///
    /// Fails with [`StoreError::Open`] when the prefix is refused.
    pub fn from_connection_manager(
        self,
        conn: ConnectionManager,
    ) -> Result<RedisStore, StoreError> {
        let location = APP_CONNECTION.to_owned();
        let keys = KeyLayout::new(&self.prefix).map_err(|reason| StoreError::Open {
            location: location.clone(),
            reason,
        })?;
        Ok(RedisStore::with_parts(
            RedisConnection::Node(conn),
            keys,
            location,
        ))
    }

    /// A store on a cluster connection the app already has.
    ///
    /// Fails with [`StoreError::Open`] when the prefix is refused.
    pub fn from_cluster_connection(
        self,
        conn: ClusterConnection,
    ) -> Result<RedisStore, StoreError> {
        let location = APP_CLUSTER_CONNECTION.to_owned();
        let keys = KeyLayout::new(&self.prefix).map_err(|reason| StoreError::Open {
            location: location.clone(),
            reason,
        })?;
        Ok(RedisStore::with_parts(
            RedisConnection::Cluster(conn),
            keys,
            location,
        ))
    }
}

impl RedisStore {
    /// Connects to the Redis at `url` with the default key prefix `idempotent`; see
    /// [`RedisStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::builder().connect(url).await
    }

    /// Connects to the Redis Cluster whose seed nodes are `nodes`, with the default key
    /// prefix; see [`RedisStoreBuilder::connect_cluster`].
    pub async fn connect_cluster<I, S>(nodes: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::builder().connect_cluster(nodes).await
    }

    /// A store on a connection manager the app already has, with the default key prefix.
    pub fn from_connection_manager(conn: ConnectionManager) -> Self {
        let keys = KeyLayout::new(DEFAULT_PREFIX).expect("the default prefix is valid");
        Self::with_parts(RedisConnection::Node(conn), keys, APP_CONNECTION.to_owned())
    }

    /// Configures a store: key prefix, then [`connect`](RedisStoreBuilder::connect),
    /// [`connect_cluster`](RedisStoreBuilder::connect_cluster),
    /// [`from_connection_manager`](RedisStoreBuilder::from_connection_manager) or
    /// [`from_cluster_connection`](RedisStoreBuilder::from_cluster_connection).
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder {
            prefix: DEFAULT_PREFIX.to_owned(),
        }
    }

    fn with_parts(conn: RedisConnection, keys: KeyLayout, location: String) -> Self {
        Self {
            fenced: Arc::new(Fenced::new(RedisRecords::new(conn, keys))),
            location: location.into(),
        }
    }

    /// The prefix every key of this store starts with.
    pub fn key_prefix(&self) -> &str {
        self.records().keys().prefix()
    }

    /// The Redis key holding the record of `(scope, key)`:
    /// `<prefix>:{<scope length>:<scope>:<key>}`, with `%`, `{` and `}` in scope and key
    /// percent-encoded (so the hash tag always covers exactly scope and key) and the
    /// length that of the encoded scope. For operators inspecting a record
    /// (`HGETALL`, `PTTL`).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), idempotent_runtime::StoreError> {
    /// let store = idempotent_runtime::store::RedisStore::connect("redis://127.0.0.1/").await?;
    /// assert_eq!(store.record_key("acct_alice", "k1"), "idempotent:{10:acct_alice:k1}");
    /// # Ok(()) }
    /// ```
    pub fn record_key(&self, scope: &str, key: &str) -> String {
        self.records().keys().record(scope, key)
    }

    /// The connection the store uses, one server's or a cluster's (a clone shares it).
    pub fn connection(&self) -> &RedisConnection {
        self.records().connection()
    }

    /// The record register under the store: what the protocol reads and writes, one
    /// script per operation (see the module docs).
    pub fn records(&self) -> &RedisRecords {
        self.fenced.records()
    }

    /// The connection manager of a store on one server (a clone shares it); `None` on a
    /// cluster (see [`connection`](Self::connection)).
    pub fn connection_manager(&self) -> Option<&ConnectionManager> {
        match self.connection() {
            RedisConnection::Node(conn) => Some(conn),
            RedisConnection::Cluster(_) => None,
        }
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("location", &self.location)
            .field("key_prefix", &self.key_prefix())
            .finish_non_exhaustive()
    }
}

/// Every operation is the protocol's over the records: forwarding (rather than
/// implementing [`Store`] method by method) keeps every operation the protocol has, those
/// added later included.
impl Forward for RedisStore {
    fn inner(&self) -> &dyn Store {
        &*self.fenced
    }
}

/// Warns when a server may evict records under memory pressure (module docs); on a
/// cluster, asks every primary. Servers that refuse `CONFIG` (managed services often do)
/// are not blamed.
async fn warn_unless_noeviction(conn: &mut RedisConnection, location: &str) {
    match conn {
        RedisConnection::Node(_) => warn_unless_noeviction_on(conn, location).await,
        RedisConnection::Cluster(cluster) => {
            // A cluster that cannot list its primaries fails the first purge loudly; the
            // warning is only advice.
            for mut primary in connection::primaries(cluster).await.unwrap_or_default() {
                warn_unless_noeviction_on(&mut primary, location).await;
            }
        }
    }
}

async fn warn_unless_noeviction_on(conn: &mut (impl ConnectionLike + Send), location: &str) {
    let reply: RedisResult<Vec<String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(conn)
        .await;
    if let Some(policy) = reply.ok().as_deref().and_then(evicting_policy) {
        tracing::warn!(
            location,
            maxmemory_policy = %policy,
            "the Redis behind the idempotency store may evict records under memory pressure \
             (a lost record lets a retry run the handler again); use maxmemory-policy noeviction"
        );
    }
}

/// The policy named in a `CONFIG GET maxmemory-policy` reply, unless it is `noeviction`.
fn evicting_policy(reply: &[String]) -> Option<&str> {
    match reply {
        [_, policy] if policy != "noeviction" => Some(policy),
        _ => None,
    }
}

/// The seed node URLs (`redis://…` or `rediss://…`) of a `redis+cluster://` or
/// `rediss+cluster://` URL; `None` for any other URL. User info, path and query are
/// copied onto every seed.
fn cluster_seeds(url: &str) -> Option<Result<Vec<String>, String>> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = match scheme {
        "redis+cluster" => "redis",
        "rediss+cluster" => "rediss",
        _ => return None,
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let (user_info, hosts) = match authority.rsplit_once('@') {
        Some((user_info, hosts)) => (format!("{user_info}@"), hosts),
        None => (String::new(), authority),
    };
    let seeds: Vec<String> = hosts
        .split(',')
        .filter(|host| !host.is_empty())
        .map(|host| format!("{scheme}://{user_info}{host}{tail}"))
        .collect();
    if seeds.is_empty() {
        return Some(Err(format!(
            "a {CLUSTER_SCHEME} URL names no node (expected {CLUSTER_SCHEME}://host:port[,host:port…])"
        )));
    }
    Some(Ok(seeds))
}

/// The password forms in `url` (raw and percent-decoded), to scrub from error messages.
fn url_secrets(url: &str) -> Vec<String> {
    let Ok(parsed) = url::Url::parse(url) else {
        return Vec::new();
    };
    let mut secrets = Vec::new();
    if let Some(password) = parsed.password() {
        secrets.push(password.to_owned());
        if let Ok(decoded) = percent_encoding::percent_decode_str(password).decode_utf8() {
            secrets.push(decoded.into_owned());
        }
    }
    for (name, value) in parsed.query_pairs() {
        if is_secret_param(&name) {
            secrets.push(value.into_owned());
        }
    }
    secrets.retain(|s| !s.is_empty());
    secrets
}

/// `message` with every secret replaced by `***`.
fn scrub(mut message: String, secrets: &[String]) -> String {
    for secret in secrets {
        message = message.replace(secret.as_str(), "***");
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrubs_raw_and_decoded_passwords() {
        let secrets = url_secrets("redis://u:s3cr%40t@h/?password=other");
        assert_eq!(secrets, ["s3cr%40t", "s3cr@t", "other"]);
        assert_eq!(
            scrub("auth s3cr@t / s3cr%40t / other failed".into(), &secrets),
            "auth *** / *** / *** failed"
        );
    }

    #[test]
    fn cluster_urls_name_their_seeds() {
        assert_eq!(cluster_seeds("redis://127.0.0.1:7000/"), None);
        assert_eq!(cluster_seeds("redis+unix:///run/redis.sock"), None);
        assert_eq!(
            cluster_seeds("redis+cluster://127.0.0.1:7000/"),
            Some(Ok(vec!["redis://127.0.0.1:7000/".to_owned()]))
        );
        assert_eq!(
            cluster_seeds("rediss+cluster://u:p%40w@a:7000,b:7001?protocol=resp3"),
            Some(Ok(vec![
                "rediss://u:p%40w@a:7000?protocol=resp3".to_owned(),
                "rediss://u:p%40w@b:7001?protocol=resp3".to_owned(),
            ]))
        );
        assert!(matches!(cluster_seeds("redis+cluster:///"), Some(Err(_))));
    }

    #[test]
    fn warns_about_every_policy_but_noeviction() {
        let reply = |policy: &str| vec!["maxmemory-policy".to_owned(), policy.to_owned()];
        assert_eq!(evicting_policy(&reply("noeviction")), None);
        assert_eq!(evicting_policy(&reply("allkeys-lru")), Some("allkeys-lru"));
        assert_eq!(
            evicting_policy(&reply("volatile-ttl")),
            Some("volatile-ttl")
        );
        assert_eq!(evicting_policy(&[]), None, "CONFIG renamed or refused");
    }
}
