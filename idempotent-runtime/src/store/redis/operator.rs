//! The operator tools on Redis: `inspect` and `forget` are one script each
//! (`scripts/inspect.lua`, `scripts/forget.lua`), atomic on the server and judged at its
//! `TIME`, like every other operation of the store.

use redis::Value;

use super::{RedisStore, bulk, scripts, store_error};
use crate::fingerprint::Fingerprint;
use crate::store::operator::{lease_left_from_millis, system_time_from_millis};
use crate::store::{ForgetOutcome, RecordInfo, RecordState, StoreError, decode_steps};

impl RedisStore {
    pub(super) async fn inspect_record(
        &self,
        scope: &str,
        key: &str,
    ) -> Result<Option<RecordInfo>, StoreError> {
        let reply: Value = scripts::INSPECT
            .key(self.keys.record(scope, key))
            .arg(self.offset())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(store_error)?;
        match reply {
            Value::Nil => Ok(None),
            Value::Array(items) => record_info(items).map(Some),
            _ => Err(corrupt("an inspect reply that is not an array")),
        }
    }

    pub(super) async fn forget_record(
        &self,
        scope: &str,
        key: &str,
        force: bool,
    ) -> Result<ForgetOutcome, StoreError> {
        let reply: Value = scripts::FORGET
            .key(self.keys.record(scope, key))
            .arg(self.offset())
            .arg(if force { "1" } else { "0" })
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(store_error)?;
        forget_outcome(reply)
    }
}

/// Decodes the forget script's reply (see `scripts/forget.lua`).
fn forget_outcome(reply: Value) -> Result<ForgetOutcome, StoreError> {
    let Value::Array(mut items) = reply else {
        return Err(corrupt("a forget reply that is not an array"));
    };
    if items.is_empty() {
        return Err(corrupt("an empty forget reply"));
    }
    let tag = bulk(items.remove(0)).ok_or_else(|| corrupt("a forget reply without a tag"))?;
    match tag.as_slice() {
        b"not_found" => Ok(ForgetOutcome::NotFound),
        b"refused" => match items.first() {
            Some(Value::Int(left)) => Ok(ForgetOutcome::Refused {
                lease_left: lease_left_from_millis(*left),
            }),
            _ => Err(corrupt("refused without the lease time left")),
        },
        b"forgotten" => record_info(items).map(ForgetOutcome::Forgotten),
        other => Err(corrupt(&String::from_utf8_lossy(other))),
    }
}

/// Decodes the prelude's `describe`: state, digest, version, created_at, expires_at,
/// lease_expires_at, lease held (1/0), status, steps.
fn record_info(items: Vec<Value>) -> Result<RecordInfo, StoreError> {
    let [
        state,
        fp,
        fpv,
        created_at,
        expires_at,
        lease_expires_at,
        held,
        status,
        steps,
    ]: [Value; 9] = items
        .try_into()
        .map_err(|_| corrupt("a record description of the wrong length"))?;
    let digest = bulk(fp)
        .and_then(|d| <[u8; 32]>::try_from(d.as_slice()).ok())
        .ok_or_else(|| corrupt("a fingerprint that is not 32 bytes"))?;
    let version = number(fpv)
        .and_then(|v| i16::try_from(v).ok())
        .ok_or_else(|| corrupt("no valid fingerprint version"))?;
    let created_at = number(created_at).ok_or_else(|| {
        corrupt(
            "no created_at (a record written before the store kept it; it expires with its TTL)",
        )
    })?;
    let expires_at = number(expires_at).ok_or_else(|| corrupt("no valid expires_at"))?;
    let state = match bulk(state).as_deref() {
        Some(b"in_progress") => RecordState::InProgress {
            lease_expires_at: system_time_from_millis(
                number(lease_expires_at).ok_or_else(|| corrupt("no valid lease_expires_at"))?,
            ),
            holder_alive: matches!(held, Value::Int(1)),
        },
        Some(b"completed") => RecordState::Completed {
            status: number(status)
                .and_then(|s| u16::try_from(s).ok())
                .ok_or_else(|| corrupt("a completed record without a valid status"))?,
        },
        _ => return Err(corrupt("no valid state")),
    };
    let steps = match steps {
        Value::Nil => Vec::new(),
        other => decode_steps(&bulk(other).ok_or_else(|| corrupt("steps that are not a string"))?)?,
    };
    Ok(RecordInfo::new(
        state,
        Fingerprint { version, digest },
        system_time_from_millis(created_at),
        system_time_from_millis(expires_at),
    )
    .with_steps(steps))
}

/// An integer sent as a string (hash fields) or as an integer reply.
fn number(value: Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(n),
        other => std::str::from_utf8(&bulk(other)?).ok()?.parse().ok(),
    }
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("unexpected idempotency record reply: {what}"))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use bytes::Bytes;

    use super::*;
    use crate::store::{RecordedStep, encode_step};

    fn s(b: &[u8]) -> Value {
        Value::BulkString(b.to_vec())
    }

    fn described(state: &[u8], held: i64, status: Value) -> Vec<Value> {
        vec![
            s(state),
            s(&[9; 32]),
            s(b"2"),
            s(b"1000"),
            s(b"5000"),
            s(b"2000"),
            Value::Int(held),
            status,
            Value::Nil,
        ]
    }

    #[test]
    fn decodes_every_forget_reply() {
        assert_eq!(
            forget_outcome(Value::Array(vec![s(b"not_found")])).unwrap(),
            ForgetOutcome::NotFound
        );
        assert_eq!(
            forget_outcome(Value::Array(vec![s(b"refused"), Value::Int(1500)])).unwrap(),
            ForgetOutcome::Refused {
                lease_left: Duration::from_millis(1500)
            }
        );
        let mut reply = vec![s(b"forgotten")];
        reply.extend(described(b"in_progress", 1, Value::Nil));
        let ForgetOutcome::Forgotten(info) = forget_outcome(Value::Array(reply)).unwrap() else {
            panic!("forgotten");
        };
        assert_eq!(
            info.state,
            RecordState::InProgress {
                lease_expires_at: UNIX_EPOCH + Duration::from_secs(2),
                holder_alive: true
            }
        );
        assert_eq!(info.fingerprint.version, 2);
        assert_eq!(info.created_at, UNIX_EPOCH + Duration::from_secs(1));
        assert_eq!(info.expires_at, UNIX_EPOCH + Duration::from_secs(5));
        assert!(info.steps.is_empty());
        let step = RecordedStep {
            name: "charge".to_owned(),
            output: Bytes::from_static(b"{\"id\":1}"),
            recorded_at: UNIX_EPOCH + Duration::from_millis(1234),
        };
        let mut with_steps = described(b"in_progress", 0, Value::Nil);
        with_steps[8] = s(&encode_step(&step));
        assert_eq!(
            record_info(with_steps).unwrap().steps,
            std::slice::from_ref(&step)
        );
        let mut cut = described(b"in_progress", 0, Value::Nil);
        cut[8] = s(&encode_step(&step)[..5]);
        assert!(matches!(record_info(cut), Err(StoreError::Corrupt(_))));
        let completed = record_info(described(b"completed", 0, s(b"201"))).unwrap();
        assert_eq!(completed.state, RecordState::Completed { status: 201 });
        for bad in [
            Value::Nil,
            Value::Array(vec![]),
            Value::Array(vec![s(b"other")]),
            Value::Array(vec![s(b"refused")]),
            Value::Array(vec![s(b"forgotten"), s(b"in_progress")]),
        ] {
            assert!(
                matches!(forget_outcome(bad.clone()), Err(StoreError::Corrupt(_))),
                "{bad:?}"
            );
        }
        let mut no_created = described(b"completed", 0, s(b"200"));
        no_created[3] = Value::Nil;
        assert!(record_info(no_created).is_err());
        assert!(record_info(described(b"completed", 0, Value::Nil)).is_err());
        assert!(record_info(described(b"gone", 0, Value::Nil)).is_err());
    }
}
