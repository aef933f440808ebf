//! [`RedisRecords`]: the fenced record register on Redis. One hash per record, one script
//! per operation (insert, read, compare-and-set, delete), each answering with the
//! server's `TIME`; [`Fenced`](crate::fenced::Fenced) decides everything else.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, RedisResult, ScriptInvocation, ServerErrorKind, Value};

use super::connection::{self, RedisConnection};
use super::keys::KeyLayout;
use super::scripts;
use crate::clock::millis;
use crate::fingerprint::Fingerprint;
use crate::store::{
    Change, ClaimRequest, FencingToken, Inserted, KeyedRecord, Record, RecordBody, RecordStore,
    StoreError, StoreNow, StoredResponse, Updated, decode_headers, encode_headers,
};

/// TTLs and leases are clamped to 1000 years, far inside the range in which the scripts'
/// Lua numbers (doubles) hold milliseconds exactly.
const MAX_DURATION_MS: i64 = 1000 * 366 * 24 * 60 * 60 * 1000;

/// How many times a script is loaded again when the server forgot it right after a load.
const RELOADS: usize = 3;

/// How many keys one `SCAN` step of `past_expiry` asks for.
const SCAN_COUNT: u32 = 1000;

/// The records of one key prefix on one Redis server or Redis Cluster: a
/// [`RecordStore`], the storage under [`RedisStore`](super::RedisStore).
///
/// A record is one hash (the fields are listed in the module docs of
/// [`RedisStore`](super::RedisStore)); every operation is one script on the server that
/// owns the record's slot, atomic there, judged at that server's `TIME`.
#[derive(Debug, Clone)]
pub struct RedisRecords {
    conn: RedisConnection,
    keys: KeyLayout,
}

impl RedisRecords {
    pub(super) fn new(conn: RedisConnection, keys: KeyLayout) -> Self {
        Self { conn, keys }
    }

    /// The connection, one server's or a cluster's (a clone shares it).
    pub fn connection(&self) -> &RedisConnection {
        &self.conn
    }

    pub(super) fn keys(&self) -> &KeyLayout {
        &self.keys
    }

    async fn run(&self, script: &ScriptInvocation<'_>) -> Result<Value, StoreError> {
        let mut reloads = 0;
        loop {
            match script.invoke_async(&mut self.conn.clone()).await {
                // A `SCRIPT FLUSH` or a failover between the client's load and its second
                // `EVALSHA` answers NOSCRIPT again: load again.
                Err(err) if no_script(&err) && reloads < RELOADS => reloads += 1,
                answer => return answer.map_err(store_error),
            }
        }
    }

    /// Candidates on one server: `conn` is a standalone server's connection, or a
    /// cluster connection pinned to one primary (whose `SCAN` returns only its own keys,
    /// which the pipeline of reads then goes back to). Keeps the earliest `now` read.
    async fn past_expiry_on(
        &self,
        conn: &mut (impl ConnectionLike + Send),
        limit: usize,
        found: &mut Vec<KeyedRecord>,
        now: &mut Option<StoreNow>,
    ) -> Result<(), StoreError> {
        let pattern = self.keys.scan_pattern();
        let mut cursor = 0_u64;
        loop {
            let (next, candidates): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .query_async(conn)
                .await
                .map_err(store_error)?;
            let mut pipe = redis::pipe();
            // A pipeline cannot load a script when the server answers NOSCRIPT.
            pipe.load_script(&scripts::READ).ignore();
            for key in &candidates {
                pipe.invoke_script(&scripts::READ.key(key));
            }
            let mut reloads = 0;
            let replies = loop {
                let replies: Vec<RedisResult<Value>> = pipe
                    .clone()
                    .ignore_errors()
                    .query_async(conn)
                    .await
                    .map_err(store_error)?;
                // The script flushed between the pipeline's load and its reads: again.
                let flushed = replies.iter().any(|r| r.as_ref().is_err_and(no_script));
                if !flushed || reloads == RELOADS {
                    break replies;
                }
                reloads += 1;
            };
            for (key, reply) in candidates.iter().zip(replies) {
                let key = String::from_utf8_lossy(key);
                let read = reply
                    .map_err(store_error)
                    .and_then(|reply| Reply::decode(reply, &key));
                // One unreadable record (or a key of another type) must not stop the
                // sweep of all the others.
                let (record, at) = match read {
                    Ok(Reply { record, now, .. }) => (record, now),
                    Err(err) => {
                        tracing::warn!(%key, error = %err, "cannot read idempotency record");
                        continue;
                    }
                };
                let earliest = now.get_or_insert(at);
                if at.wall_millis < earliest.wall_millis {
                    *earliest = at;
                }
                let (Some(record), Some((scope, key))) = (record, self.keys.parse(&key)) else {
                    continue;
                };
                if record.expires_at <= at.wall_millis && found.len() < limit {
                    found.push(KeyedRecord { scope, key, record });
                }
            }
            if next == 0 || found.len() >= limit {
                return Ok(());
            }
            cursor = next;
        }
    }
}

#[async_trait]
impl RecordStore for RedisRecords {
    async fn insert(&self, claim: &ClaimRequest<'_>) -> Result<Inserted, StoreError> {
        let record_key = self.keys.record(claim.scope, claim.key);
        let mut script = scripts::INSERT.key(&record_key);
        script.arg(Record::first_version(claim.token));
        claim_args(&mut script, claim);
        let reply = Reply::decode(self.run(&script).await?, &record_key)?;
        Ok(match reply.record {
            None => Inserted::Inserted,
            Some(record) => Inserted::Exists(record, reply.now),
        })
    }

    async fn read(&self, scope: &str, key: &str) -> Result<(Option<Record>, StoreNow), StoreError> {
        let record_key = self.keys.record(scope, key);
        let reply = self.run(&scripts::READ.key(&record_key)).await?;
        let reply = Reply::decode(reply, &record_key)?;
        Ok((reply.record, reply.now))
    }

    async fn update(
        &self,
        scope: &str,
        key: &str,
        version: u64,
        change: &Change<'_>,
    ) -> Result<Updated, StoreError> {
        let record_key = self.keys.record(scope, key);
        let next = version.wrapping_add(1);
        let mut script = scripts::UPDATE.key(&record_key);
        script.arg(version).arg(next);
        match *change {
            Change::TakeOver { claim, keep_steps } => {
                script.arg("claim");
                claim_args(&mut script, claim);
                script.arg(if keep_steps { "1" } else { "0" });
            }
            Change::Renew { lease, ttl } => {
                script
                    .arg("renew")
                    .arg(clamped_millis(lease))
                    .arg(clamped_millis(ttl));
            }
            Change::AppendStep(step) => {
                script.arg("step").arg(step);
            }
            Change::Complete(response) => {
                let (has_body, body): (&str, &[u8]) = match &response.body {
                    Some(body) => ("1", body),
                    None => ("0", b""),
                };
                script
                    .arg("complete")
                    .arg(response.status)
                    .arg(encode_headers(&response.headers))
                    .arg(has_body)
                    .arg(body);
            }
            Change::EndLease => {
                script.arg("end_lease").arg(FencingToken::RELEASED.0);
            }
        }
        let reply = Reply::decode(self.run(&script).await?, &record_key)?;
        Ok(if reply.applied {
            Updated::Updated(next)
        } else {
            Updated::Stale(reply.record, reply.now)
        })
    }

    async fn delete(&self, scope: &str, key: &str, version: u64) -> Result<bool, StoreError> {
        let deleted = self
            .run(
                scripts::DELETE
                    .key(self.keys.record(scope, key))
                    .arg(version),
            )
            .await?;
        Ok(matches!(deleted, Value::Int(1)))
    }

    /// On one server, one pipeline of the delete script, one invocation per record; on
    /// a cluster, whose records of one batch live on several primaries, one script call
    /// per record.
    async fn delete_many(&self, records: &[(&str, &str, u64)]) -> Result<u64, StoreError> {
        let RedisConnection::Node(conn) = &self.conn else {
            let mut deleted = 0;
            for &(scope, key, version) in records {
                if self.delete(scope, key, version).await? {
                    deleted += 1;
                }
            }
            return Ok(deleted);
        };
        if records.is_empty() {
            return Ok(0);
        }
        let mut pipe = redis::pipe();
        // A pipeline cannot load a script when the server answers NOSCRIPT.
        pipe.load_script(&scripts::DELETE).ignore();
        for &(scope, key, version) in records {
            pipe.invoke_script(
                scripts::DELETE
                    .key(self.keys.record(scope, key))
                    .arg(version),
            );
        }
        // Each record is deleted at most once, so the deletions of every attempt add up.
        let mut deleted = 0;
        for reloads in 0.. {
            let replies: Vec<RedisResult<Value>> = pipe
                .clone()
                .ignore_errors()
                .query_async(&mut conn.clone())
                .await
                .map_err(store_error)?;
            let mut flushed = None;
            for reply in replies {
                match reply {
                    Ok(Value::Int(1)) => deleted += 1,
                    Ok(_) => {}
                    Err(err) if no_script(&err) => flushed = Some(err),
                    Err(err) => return Err(store_error(err)),
                }
            }
            // The script flushed between the pipeline's load and its deletes: again.
            match flushed {
                Some(err) if reloads == RELOADS => return Err(store_error(err)),
                Some(_) => {}
                None => break,
            }
        }
        Ok(deleted)
    }

    /// Walks the prefix with `SCAN` (on a cluster, on every primary in turn, listed with
    /// `CLUSTER SLOTS`) and reads each key found; a primary that is down fails the call.
    async fn past_expiry(&self, limit: u32) -> Result<(Vec<KeyedRecord>, StoreNow), StoreError> {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let (mut found, mut now) = (Vec::new(), None);
        match &self.conn {
            RedisConnection::Node(conn) => {
                self.past_expiry_on(&mut conn.clone(), limit, &mut found, &mut now)
                    .await?;
            }
            RedisConnection::Cluster(conn) => {
                for mut primary in connection::primaries(conn).await.map_err(store_error)? {
                    if found.len() >= limit {
                        break;
                    }
                    self.past_expiry_on(&mut primary, limit, &mut found, &mut now)
                        .await?;
                }
            }
        }
        let now = match now {
            Some(now) => now,
            // Nothing was read: the now only needs to judge nothing.
            None => self.read("", "").await?.1,
        };
        Ok((found, now))
    }
}

/// A claim's arguments, in the order the prelude's `claim` reads them.
fn claim_args(script: &mut ScriptInvocation<'_>, claim: &ClaimRequest<'_>) {
    script
        .arg(&claim.fingerprint.digest[..])
        .arg(claim.fingerprint.version)
        .arg(claim.token.0)
        .arg(clamped_millis(claim.ttl))
        .arg(clamped_millis(claim.lease));
}

fn clamped_millis(d: Duration) -> i64 {
    millis(d).min(MAX_DURATION_MS)
}

/// A script's answer: whether it applied, the server's now, and the record it answered.
#[derive(Debug)]
struct Reply {
    applied: bool,
    now: StoreNow,
    record: Option<Record>,
}

impl Reply {
    /// Decodes `{outcome, now[, fields…]}` (see the prelude's `answer` and `dump`) from
    /// the script run on `key`.
    fn decode(reply: Value, key: &str) -> Result<Self, StoreError> {
        let corrupt = |what: &str| StoreError::Corrupt(format!("idempotency record {key}: {what}"));
        let Value::Array(items) = reply else {
            return Err(corrupt("a script reply that is not an array"));
        };
        let mut items = items.into_iter();
        let (Some(Value::Int(outcome)), Some(Value::Int(now))) = (items.next(), items.next())
        else {
            return Err(corrupt("a script reply without its outcome and time"));
        };
        let now = StoreNow {
            wall_millis: now,
            lease_millis: now,
        };
        let fields: Vec<Value> = items.collect();
        let record = if fields.is_empty() {
            None
        } else {
            Some(decode_record(fields).map_err(|what| corrupt(&what))?)
        };
        Ok(Self {
            applied: outcome == 1,
            now,
            record,
        })
    }
}

/// A record from its fields, in the prelude's `FIELDS` order.
fn decode_record(fields: Vec<Value>) -> Result<Record, String> {
    let [
        state,
        fp,
        fpv,
        token,
        lease_expires_at,
        expires_at,
        created_at,
        steps,
        status,
        headers,
        body,
        version,
    ]: [Value; 12] = fields
        .try_into()
        .map_err(|_| "the wrong number of fields".to_owned())?;
    let digest = bulk(fp)
        .and_then(|d| <[u8; 32]>::try_from(d.as_slice()).ok())
        .ok_or("a fingerprint that is not 32 bytes")?;
    let fingerprint = Fingerprint {
        version: number(fpv).ok_or("no valid fingerprint version")?,
        digest,
    };
    let body = match bulk(state).as_deref() {
        Some(b"in_progress") => RecordBody::InProgress {
            lease_expires_at: number(lease_expires_at).ok_or("no valid lease_expires_at")?,
            steps: bulk(steps).map(Bytes::from).unwrap_or_default(),
        },
        Some(b"completed") => RecordBody::Completed(StoredResponse {
            status: number(status).ok_or("a completed record without a valid status")?,
            headers: decode_headers(&bulk(headers).ok_or("a completed record without headers")?)
                .map_err(|e| e.to_string())?,
            body: bulk(body).map(Bytes::from),
        }),
        _ => return Err("no valid state".to_owned()),
    };
    Ok(Record {
        fingerprint,
        token: FencingToken(number(token).ok_or("no valid token")?),
        version: number(version).ok_or("no valid version")?,
        created_at: number(created_at).ok_or("no valid created_at")?,
        expires_at: number(expires_at).ok_or("no valid expires_at")?,
        body,
    })
}

/// The bytes of a string reply (`None` for a missing field).
fn bulk(value: Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(s) => Some(s.into_bytes()),
        _ => None,
    }
}

/// A number kept as a decimal string.
fn number<T: std::str::FromStr>(value: Value) -> Option<T> {
    std::str::from_utf8(&bulk(value)?).ok()?.parse().ok()
}

/// Whether the server did not know a script.
fn no_script(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Everything the server refuses is Redis failing.
pub(super) fn store_error(err: RedisError) -> StoreError {
    StoreError::Redis(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{RecordedStep, encode_step};

    fn s(b: &[u8]) -> Value {
        Value::BulkString(b.to_vec())
    }

    fn reply(outcome: i64, fields: Option<Vec<Value>>) -> Value {
        let mut items = vec![Value::Int(outcome), Value::Int(1_700_000_000_000)];
        items.extend(fields.unwrap_or_default());
        Value::Array(items)
    }

    fn in_progress(steps: Value) -> Vec<Value> {
        vec![
            s(b"in_progress"),
            s(&[9; 32]),
            s(b"2"),
            s(b"-17"),
            s(b"2000"),
            s(b"5000"),
            s(b"1000"),
            steps,
            Value::Nil,
            Value::Nil,
            Value::Nil,
            s(b"18446744073709551615"),
        ]
    }

    #[test]
    fn decodes_records_and_answers() {
        let answer = Reply::decode(reply(1, None), "k").unwrap();
        assert!(answer.applied);
        assert_eq!(answer.now.wall_millis, 1_700_000_000_000);
        assert_eq!(answer.now, answer.now);
        assert_eq!(answer.record, None);

        let step = RecordedStep {
            name: "charge".to_owned(),
            output: Bytes::from_static(b"{}"),
            recorded_at: std::time::UNIX_EPOCH + Duration::from_millis(99),
        };
        let answer =
            Reply::decode(reply(0, Some(in_progress(s(&encode_step(&step))))), "k").unwrap();
        assert!(!answer.applied);
        let record = answer.record.unwrap();
        assert_eq!(record.version, u64::MAX);
        assert_eq!(record.token, FencingToken(-17));
        assert_eq!(record.fingerprint.version, 2);
        assert_eq!((record.created_at, record.expires_at), (1000, 5000));
        assert_eq!(
            record.body,
            RecordBody::InProgress {
                lease_expires_at: 2000,
                steps: Bytes::from(encode_step(&step)),
            }
        );
        let no_steps = Reply::decode(reply(0, Some(in_progress(Value::Nil))), "k").unwrap();
        assert!(matches!(
            no_steps.record.unwrap().body,
            RecordBody::InProgress { steps, .. } if steps.is_empty()
        ));

        let headers = encode_headers(&[("a".to_owned(), b"b".to_vec())]);
        let mut completed = in_progress(Value::Nil);
        completed[0] = s(b"completed");
        completed[8] = s(b"201");
        completed[9] = s(&headers);
        let over_cap = Reply::decode(reply(0, Some(completed.clone())), "k").unwrap();
        assert_eq!(
            over_cap.record.unwrap().body,
            RecordBody::Completed(StoredResponse {
                status: 201,
                headers: vec![("a".to_owned(), b"b".to_vec())],
                body: None,
            })
        );
        completed[10] = s(b"");
        let empty = Reply::decode(reply(0, Some(completed.clone())), "k").unwrap();
        assert!(matches!(
            empty.record.unwrap().body,
            RecordBody::Completed(StoredResponse { body: Some(body), .. }) if body.is_empty()
        ));

        let broken = |at: usize, value: Value| {
            let mut fields = completed.clone();
            fields[at] = value;
            reply(0, Some(fields))
        };
        for bad in [
            Value::Nil,
            Value::Array(vec![Value::Int(1)]),
            reply(0, Some(vec![s(b"completed")])),
            broken(0, s(b"bogus")),
            broken(1, s(&[1; 31])),
            broken(2, s(b"x")),
            broken(3, Value::Nil),
            broken(5, s(b"1e9")),
            broken(6, Value::Nil),
            broken(8, s(b"abc")),
            broken(9, s(b"\xff")),
            broken(11, s(b"-1")),
        ] {
            assert!(
                matches!(Reply::decode(bad.clone(), "k"), Err(StoreError::Corrupt(_))),
                "{bad:?}"
            );
        }
    }
}
