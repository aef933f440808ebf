//! What a [`RedisStore`](super::RedisStore) talks through: one server's connection manager
//! or a Redis Cluster client, behind the `redis` crate's one async connection trait, so
//! every script call is the same code on both. Only what must visit every primary
//! (`purge_expired`'s `SCAN`, the eviction-policy check) asks which one it has.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};

/// The connection of a [`RedisStore`](super::RedisStore): one server, or a cluster.
/// Cheap to clone (clones share the connection); implements the `redis` crate's
/// [`ConnectionLike`], so an app or a test can run its own commands on it.
#[derive(Clone)]
pub enum RedisConnection {
    /// One server (standalone, or the primary behind a Sentinel-aware or proxy address),
    /// reconnected by the manager when the connection breaks.
    Node(ConnectionManager),
    /// A Redis Cluster: each command goes to the primary that owns its key's slot, and the
    /// client follows `MOVED`/`ASK` redirections and failovers.
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Node(_) => "RedisConnection::Node",
            Self::Cluster(_) => "RedisConnection::Cluster",
        })
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Node(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Node(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Node(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

/// A cluster connection pinned to one node: every command and pipeline goes to the node
/// at `host:port`, whatever its keys. For commands whose answer is per node (`SCAN`,
/// `CONFIG GET`) and for the purge of the keys that node's `SCAN` returned.
#[derive(Clone)]
pub(super) struct OnNode {
    conn: ClusterConnection,
    host: String,
    port: u16,
}

impl OnNode {
    fn route(&self) -> SingleNodeRoutingInfo {
        SingleNodeRoutingInfo::ByAddress {
            host: self.host.clone(),
            port: self.port,
        }
    }
}

impl ConnectionLike for OnNode {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let route = RoutingInfo::SingleNode(self.route());
        Box::pin(self.conn.route_command(cmd.clone(), route))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let route = self.route();
        Box::pin(
            self.conn
                .route_pipeline(pipeline.clone(), offset, count, route),
        )
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// Every primary of the cluster, each pinned (from `CLUSTER SLOTS`, asked of any node:
/// a primary serves one or more slot ranges, and comes first in each range's entry).
pub(super) async fn primaries(conn: &ClusterConnection) -> RedisResult<Vec<OnNode>> {
    let reply = conn
        .clone()
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await?;
    let addresses = primary_addresses(reply)?;
    Ok(addresses
        .into_iter()
        .map(|(host, port)| OnNode {
            conn: conn.clone(),
            host,
            port,
        })
        .collect())
}

/// The distinct primaries' `(host, port)` in a `CLUSTER SLOTS` reply: entries
/// `[start, end, [host, port, id, …], replicas…]`, in the order first seen.
fn primary_addresses(reply: Value) -> RedisResult<Vec<(String, u16)>> {
    let unexpected = || {
        RedisError::from((
            ErrorKind::Parse,
            "unexpected CLUSTER SLOTS reply (the cluster's primaries cannot be listed)",
        ))
    };
    let Value::Array(ranges) = reply else {
        return Err(unexpected());
    };
    let mut primaries: Vec<(String, u16)> = Vec::new();
    for range in ranges {
        let Value::Array(range) = range else {
            return Err(unexpected());
        };
        let Some(Value::Array(primary)) = range.into_iter().nth(2) else {
            return Err(unexpected());
        };
        let mut fields = primary.into_iter();
        let host = match fields.next() {
            Some(Value::BulkString(host)) => String::from_utf8(host).map_err(|_| unexpected())?,
            Some(Value::SimpleString(host)) => host,
            _ => return Err(unexpected()),
        };
        let port = match fields.next() {
            Some(Value::Int(port)) => u16::try_from(port).map_err(|_| unexpected())?,
            _ => return Err(unexpected()),
        };
        if !primaries.iter().any(|(h, p)| *h == host && *p == port) {
            primaries.push((host, port));
        }
    }
    Ok(primaries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: i64, id: &str) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(id.as_bytes().to_vec()),
        ])
    }

    fn range(start: i64, end: i64, nodes: Vec<Value>) -> Value {
        let mut entry = vec![Value::Int(start), Value::Int(end)];
        entry.extend(nodes);
        Value::Array(entry)
    }

    #[test]
    fn lists_each_primary_once_and_no_replica() {
        let reply = Value::Array(vec![
            range(
                0,
                5460,
                vec![node("127.0.0.1", 7000, "a"), node("127.0.0.1", 7003, "d")],
            ),
            range(5461, 10922, vec![node("127.0.0.1", 7001, "b")]),
            // A primary serving two ranges (after resharding) is one node to scan.
            range(
                10923,
                12000,
                vec![node("127.0.0.1", 7000, "a"), node("127.0.0.1", 7005, "f")],
            ),
            range(12001, 16383, vec![node("10.0.0.9", 6379, "c")]),
        ]);
        assert_eq!(
            primary_addresses(reply).unwrap(),
            [
                ("127.0.0.1".to_owned(), 7000),
                ("127.0.0.1".to_owned(), 7001),
                ("10.0.0.9".to_owned(), 6379),
            ]
        );
        assert!(primary_addresses(Value::Nil).is_err());
        assert!(primary_addresses(Value::Array(vec![range(0, 1, vec![])])).is_err());
    }
}
