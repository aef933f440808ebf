//! The record register under [`RedisStore`]: each change applied exactly as
//! [`Record::claimed`] and [`Record::changed`] define it, compare-and-set on the version, and records written by
//! the previous release (no `version` field) read, resumed and completed, their version
//! moved by the previous release's own writes during a rolling upgrade.

use std::time::Duration;

use idempotent_runtime::store::{
    Change, Inserted, Record, RecordBody, RecordStore, RedisStore, StoreNow, Updated,
    encode_headers, encode_step,
};
use idempotent_runtime::store::{ClaimOutcome, ClaimRequest, FencingToken, StoredResponse};
use idempotent_runtime::{Fingerprint, Store};
use redis::AsyncCommands;

use super::{TestPrefix, redis_url, server_now_ms, shift_back, step};
use crate::fixtures::{FINGERPRINT, LEASE, TTL, claim_request, must_resume, stored};

const SCOPE: &str = "acct_alice";

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap()
}

/// The record of `key` and the server's now.
async fn read(store: &RedisStore, key: &str) -> (Option<Record>, StoreNow) {
    store.records().read(SCOPE, key).await.unwrap()
}

/// The instant a store applied `change` at, read back from the record it wrote (`None`:
/// the change does not depend on it).
fn applied_at(change: &Change<'_>, after: &Record) -> Option<i64> {
    match (change, &after.body) {
        (Change::TakeOver { .. }, _) => Some(after.created_at),
        (
            Change::Renew { lease, .. },
            RecordBody::InProgress {
                lease_expires_at, ..
            },
        ) => Some(lease_expires_at - ms(*lease)),
        (
            Change::EndLease,
            RecordBody::InProgress {
                lease_expires_at, ..
            },
        ) => Some(*lease_expires_at),
        _ => None,
    }
}

pub(crate) async fn the_register_applies_each_change_as_the_seam_defines_it() {
    let url = redis_url();
    let prefix = TestPrefix::new(&url);
    let store = prefix.store().await;
    let records = store.records();
    let token = FencingToken::random();
    let claim = claim_request("k", token);
    let (_, before) = read(&store, "k").await;
    assert_eq!(records.insert(&claim).await.unwrap(), Inserted::Inserted);
    let (inserted, after) = read(&store, "k").await;
    let inserted = inserted.expect("the record");
    let at = inserted.created_at;
    assert!(before.wall_millis <= at && at <= after.wall_millis);
    let now = StoreNow {
        wall_millis: at,
        lease_millis: at,
    };
    assert_eq!(inserted, Record::claimed(&claim, now));
    assert_eq!(inserted.version, Record::first_version(token));
    // A second insert writes nothing and answers the record.
    match records.insert(&claim).await.unwrap() {
        Inserted::Exists(record, _) => assert_eq!(record, inserted),
        other => panic!("expected Exists, got {other:?}"),
    }

    let other = Fingerprint {
        version: 3,
        digest: [7; 32],
    };
    let (a, b) = (encode_step(&step("a", "1")), encode_step(&step("b", "{}")));
    let response = StoredResponse {
        status: 201,
        headers: vec![("x-a".to_owned(), b"1".to_vec())],
        body: None,
    };
    let retry = || claim_request("k", FencingToken::random());
    let (second, third) = (retry(), retry());
    let other_claim = ClaimRequest {
        fingerprint: &other,
        ttl: Duration::from_secs(5),
        lease: Duration::from_secs(1),
        ..retry()
    };
    let changes = [
        Change::AppendStep(&a),
        Change::AppendStep(&b),
        Change::Renew {
            lease: Duration::from_secs(90),
            ttl: Duration::from_secs(7200),
        },
        Change::EndLease,
        Change::TakeOver {
            claim: &second,
            keep_steps: true,
        },
        Change::Complete(&response),
        // Changes of an in-progress record change only a completed one's version.
        Change::Renew {
            lease: LEASE,
            ttl: TTL,
        },
        Change::AppendStep(&a),
        Change::EndLease,
        Change::TakeOver {
            claim: &other_claim,
            keep_steps: true,
        },
        Change::AppendStep(&a),
        Change::TakeOver {
            claim: &third,
            keep_steps: false,
        },
        Change::Complete(&stored(b"")),
    ];
    for (i, change) in changes.iter().enumerate() {
        let (previous, before) = read(&store, "k").await;
        let previous = previous.expect("the record");
        let updated = records
            .update(SCOPE, "k", previous.version, change)
            .await
            .unwrap();
        let (written, after) = read(&store, "k").await;
        let written = written.expect("the record");
        assert_eq!(updated, Updated::Updated(written.version), "change {i}");
        let at = applied_at(change, &written).unwrap_or(after.wall_millis);
        assert!(
            before.wall_millis <= at && at <= after.wall_millis,
            "change {i}: {before:?} {at} {after:?}"
        );
        let now = StoreNow {
            wall_millis: at,
            lease_millis: at,
        };
        assert_eq!(
            written,
            previous.changed(change, now),
            "change {i}: {change:?}"
        );
        // The version it was at is stale now: nothing changes, the record comes back.
        match records
            .update(SCOPE, "k", previous.version, change)
            .await
            .unwrap()
        {
            Updated::Stale(Some(current), _) => assert_eq!(current, written, "change {i}"),
            other => panic!("change {i}: expected Stale, got {other:?}"),
        }
    }

    let (record, _) = read(&store, "k").await;
    let version = record.expect("the record").version;
    assert!(
        !records
            .delete(SCOPE, "k", version.wrapping_add(1))
            .await
            .unwrap()
    );
    assert!(records.delete(SCOPE, "k", version).await.unwrap());
    assert_eq!(read(&store, "k").await.0, None);
    assert!(matches!(
        records
            .update(SCOPE, "k", version, &Change::EndLease)
            .await
            .unwrap(),
        Updated::Stale(None, _)
    ));
    assert!(!records.delete(SCOPE, "k", version).await.unwrap());
}

/// Writes `fields` to `key` the way the previous release's scripts did (`HSET`, then
/// `PEXPIREAT`): no `version` field.
async fn write_old(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    key: &str,
    fields: &[(&str, Vec<u8>)],
    expire_at: i64,
) {
    let mut hset = redis::cmd("HSET");
    hset.arg(key);
    for (name, value) in fields {
        hset.arg(*name).arg(value.as_slice());
    }
    hset.exec_async(&mut *conn).await.unwrap();
    redis::cmd("PEXPIREAT")
        .arg(key)
        .arg(expire_at)
        .exec_async(conn)
        .await
        .unwrap();
}

/// The fields of a record the previous release's `claim.lua` wrote at `now`, in progress
/// under `token` with its lease ending at `lease_end`.
fn old_claim(token: FencingToken, now: i64, lease_end: i64) -> Vec<(&'static str, Vec<u8>)> {
    let text = |n: i64| n.to_string().into_bytes();
    vec![
        ("state", b"in_progress".to_vec()),
        ("fp", FINGERPRINT.digest.to_vec()),
        ("fpv", FINGERPRINT.version.to_string().into_bytes()),
        ("token", text(token.0)),
        ("lease_expires_at", text(lease_end)),
        ("expires_at", text(now + ms(TTL))),
        ("created_at", text(now)),
    ]
}

pub(crate) async fn records_of_the_previous_release_replay_resume_and_complete() {
    let url = redis_url();
    let prefix = TestPrefix::new(&url);
    let store = prefix.store().await;
    let mut conn = store.connection().clone();
    let now = server_now_ms(&mut conn).await;
    let expire_at = now + ms(TTL);
    let key = |name: &str| store.record_key(SCOPE, name);

    // Completed.
    let response = stored(b"old");
    let mut done = old_claim(FencingToken::random(), now, now + ms(LEASE));
    done[0].1 = b"completed".to_vec();
    done.extend([
        ("status", response.status.to_string().into_bytes()),
        ("headers", encode_headers(&response.headers)),
        ("body", response.body.as_deref().unwrap().to_vec()),
    ]);
    write_old(&mut conn, &key("done"), &done, expire_at).await;
    // In progress, its owner (an instance of the previous release) still running.
    let running_owner = FencingToken::random();
    let running = old_claim(running_owner, now, now + ms(LEASE));
    write_old(&mut conn, &key("running"), &running, expire_at).await;
    // In progress with steps.
    let (first, second) = (step("authorise", r#"{"id":"a_1"}"#), step("capture", "7"));
    let mut stepped = old_claim(FencingToken::random(), now, now + ms(LEASE));
    stepped.push((
        "steps",
        [encode_step(&first), encode_step(&second)].concat(),
    ));
    write_old(&mut conn, &key("stepped"), &stepped, expire_at).await;
    // Released keeping its steps: lease ended, token RELEASED.
    let mut released = old_claim(FencingToken::RELEASED, now, now);
    released.push(("steps", encode_step(&first)));
    write_old(&mut conn, &key("released"), &released, expire_at).await;

    // A replay.
    assert_eq!(
        store
            .claim(&claim_request("done", FencingToken::random()))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::Replay(response)
    );
    // A running claim: a duplicate waits; the old owner's step (its script appends to
    // the field) is seen; once its lease runs out the retry resumes after it.
    let info = store.inspect(SCOPE, "running").await.unwrap().unwrap();
    assert!(info.holder_alive());
    assert!(matches!(
        store
            .claim(&claim_request("running", FencingToken::random()))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::InProgress { .. }
    ));
    let charged = step("charge", r#"{"charge":"ch_1"}"#);
    let () = conn
        .hset(key("running"), "steps", encode_step(&charged))
        .await
        .unwrap();
    // A released record resumes at once.
    let resumed = must_resume(&store, "released", vec![first.clone()]).await;
    shift_back(&conn, &prefix.prefix, LEASE + Duration::from_secs(1)).await;
    let took_over = must_resume(&store, "running", vec![charged.clone()]).await;
    assert!(
        !store
            .record_step(SCOPE, "running", running_owner, &step("late", "0"))
            .await
            .unwrap(),
        "the old owner is fenced off"
    );
    let next = must_resume(&store, "stepped", vec![first.clone(), second.clone()]).await;
    // The new owners record, complete, and their responses replay.
    for (name, token) in [
        ("running", took_over),
        ("stepped", next),
        ("released", resumed),
    ] {
        let more = step("more", name);
        assert!(
            store.record_step(SCOPE, name, token, &more).await.unwrap(),
            "{name}"
        );
        let steps = store.inspect(SCOPE, name).await.unwrap().unwrap().steps;
        assert_eq!(steps.last(), Some(&more), "{name}");
        assert!(
            store
                .complete(SCOPE, name, token, &stored(b"new"))
                .await
                .unwrap(),
            "{name}"
        );
        let version: Option<String> = conn.hget(key(name), "version").await.unwrap();
        assert!(version.is_some(), "{name}: written with a version now");
        assert_eq!(
            store
                .claim(&claim_request(name, FencingToken::random()))
                .await
                .unwrap()
                .outcome,
            ClaimOutcome::Replay(stored(b"new")),
            "{name}"
        );
    }
}

pub(crate) async fn the_previous_releases_writes_move_a_record_without_a_version() {
    let url = redis_url();
    let prefix = TestPrefix::new(&url);
    let store = prefix.store().await;
    let records = store.records();
    let mut conn = store.connection().clone();
    let now = server_now_ms(&mut conn).await;
    let key = store.record_key(SCOPE, "k");
    let owner = FencingToken::random();
    write_old(
        &mut conn,
        &key,
        &old_claim(owner, now, now + ms(LEASE)),
        now + ms(TTL),
    )
    .await;
    let version = |record: Option<Record>| record.expect("the record").version;
    let first = version(read(&store, "k").await.0);
    assert_eq!(
        version(read(&store, "k").await.0),
        first,
        "the same fields, the same version"
    );
    let renew = Change::Renew {
        lease: LEASE,
        ttl: TTL,
    };
    // What each of the previous release's scripts writes moves it: a renewal, a step, a
    // release keeping steps, a completion, a takeover.
    let old_writes: [&[(&str, Vec<u8>)]; 5] = [
        &[(
            "lease_expires_at",
            (now + 2 * ms(LEASE)).to_string().into_bytes(),
        )],
        &[("steps", encode_step(&step("a", "1")))],
        &[
            ("lease_expires_at", now.to_string().into_bytes()),
            ("token", FencingToken::RELEASED.0.to_string().into_bytes()),
        ],
        &[
            ("state", b"completed".to_vec()),
            ("status", b"200".to_vec()),
            ("headers", encode_headers(&[])),
        ],
        &old_claim(FencingToken::random(), now + 1, now + ms(LEASE)),
    ];
    let mut seen = first;
    for (i, write) in old_writes.iter().enumerate() {
        if i == 4 {
            redis::cmd("DEL")
                .arg(&key)
                .exec_async(&mut conn)
                .await
                .unwrap();
        }
        write_old(&mut conn, &key, write, now + ms(TTL)).await;
        let moved = version(read(&store, "k").await.0);
        assert_ne!(moved, seen, "old write {i}");
        // A decision taken on the record before the write compares stale.
        match records.update(SCOPE, "k", seen, &renew).await.unwrap() {
            Updated::Stale(Some(current), _) => assert_eq!(current.version, moved, "{i}"),
            other => panic!("old write {i}: expected Stale, got {other:?}"),
        }
        seen = moved;
    }
    // The first write of this release adds the field, at the next version.
    assert_eq!(
        records.update(SCOPE, "k", seen, &renew).await.unwrap(),
        Updated::Updated(seen.wrapping_add(1))
    );
    let field: String = conn.hget(&key, "version").await.unwrap();
    assert_eq!(field, seen.wrapping_add(1).to_string());
}
