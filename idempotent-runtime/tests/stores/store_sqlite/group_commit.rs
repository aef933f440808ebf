//! Group commit on SQLite: many concurrent writers — claims, takeovers, renewals,
//! completions, releases — in shared transactions, with every guarantee checked; and a
//! write that fails inside a batch failing alone.
//!
//! To put chosen writes into one batch the tests hold SQLite's write lock from a
//! connection of their own (as a transactional handler does): the writer waits in `BEGIN
//! IMMEDIATE` with the batch it took, and every write sent meanwhile queues for the next
//! one. The store's batch counters (`SqliteStore::group_commit_stats`) show the batches.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idempotent_runtime::clock::ManualClock;
use idempotent_runtime::store::{
    ClaimOutcome, ClaimRequest, FencingToken, StoredResponse, Takeover,
};
use idempotent_runtime::store::{GroupCommitStats, SqliteStore, WriteKind};
use idempotent_runtime::testing::{Trial, async_trial};
use idempotent_runtime::{Fingerprint, Store, StoreError};
use sqlx::{Connection, SqliteConnection};
use tempfile::TempDir;

pub(crate) fn trials() -> Vec<Trial> {
    vec![
        async_trial(
            "group_commit::concurrent_writers_share_batches_and_keep_every_guarantee",
            concurrent_writers_share_batches_and_keep_every_guarantee,
        ),
        async_trial(
            "group_commit::each_write_is_one_trip_to_the_writer_and_a_read_answer_none",
            each_write_is_one_trip_to_the_writer_and_a_read_answer_none,
        ),
        async_trial(
            "group_commit::a_failing_write_fails_alone_in_its_batch",
            a_failing_write_fails_alone_in_its_batch,
        ),
        async_trial(
            "group_commit::a_batch_that_fails_as_a_whole_commits_none_of_its_writes",
            a_batch_that_fails_as_a_whole_commits_none_of_its_writes,
        ),
        async_trial(
            "group_commit::an_in_memory_store_takes_many_concurrent_writers_and_readers",
            an_in_memory_store_takes_many_concurrent_writers_and_readers,
        ),
        async_trial(
            "group_commit::a_connection_handed_over_inside_a_transaction_still_commits",
            a_connection_handed_over_inside_a_transaction_still_commits,
        ),
        async_trial(
            "group_commit::the_wal_is_reused_under_writes",
            the_wal_is_reused_under_writes,
        ),
        Trial::test(
            "group_commit::a_runtime_shut_down_mid_batch_deadlocks_nothing_and_leaves_the_file_sound",
            || {
                a_runtime_shut_down_mid_batch_deadlocks_nothing_and_leaves_the_file_sound();
                Ok(())
            },
        ),
    ]
}

const SCOPE: &str = "acct_group";
const TTL: Duration = Duration::from_secs(3600);
const LEASE: Duration = Duration::from_secs(30);
static FINGERPRINT: Fingerprint = Fingerprint {
    version: 1,
    digest: [7; 32],
};

struct Setup {
    store: Arc<SqliteStore>,
    clock: ManualClock,
    path: String,
    _dir: TempDir,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir
        .path()
        .join("group.db")
        .to_str()
        .expect("utf-8 path")
        .to_owned();
    let clock = ManualClock::at_millis(1_700_000_000_000);
    let store = SqliteStore::connect_with_clock(&path, Arc::new(clock.clone()))
        .await
        .expect("open");
    Setup {
        store: Arc::new(store),
        clock,
        path,
        _dir: dir,
    }
}

fn request(key: &str, token: FencingToken) -> ClaimRequest<'_> {
    ClaimRequest {
        scope: SCOPE,
        key,
        fingerprint: &FINGERPRINT,
        ttl: TTL,
        lease: LEASE,
        token,
    }
}

/// The response the owner of `token` records: it names the token, so a replay shows
/// whose completion was kept.
fn response_of(token: FencingToken) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![("x-token".to_owned(), token.0.to_string().into_bytes())],
        body: Some(Bytes::from(format!("{{\"token\":{}}}", token.0))),
    }
}

/// The writer's trips per operation, one request at a time (each write is a batch of its
/// own): a fresh key, a renewal, a step and a completion one each; a replay and a `409`
/// none (answered from the insert's read first); a takeover one (its compare-and-set,
/// after the read that found the record).
async fn each_write_is_one_trip_to_the_writer_and_a_read_answer_none() {
    let setup = setup().await;
    let (store, clock) = (&setup.store, &setup.clock);
    let writes = || store.group_commit_stats().writes;
    let owner = FencingToken::random();
    let mut before = writes();
    let mut trips = |label: &str, expected: u64| {
        let now = writes();
        assert_eq!(now - before, expected, "writes for {label}");
        before = now;
    };
    store.claim(&request("k", owner)).await.unwrap();
    trips("a fresh key", 1);
    assert!(matches!(
        store
            .claim(&request("k", FencingToken::random()))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::InProgress { .. }
    ));
    trips("a duplicate in flight", 0);
    assert!(store.renew(SCOPE, "k", owner, LEASE, TTL).await.unwrap());
    trips("a renewal", 1);
    let step = idempotent_runtime::store::RecordedStep {
        name: "charge".to_owned(),
        output: Bytes::from_static(b"ch_1"),
        recorded_at: std::time::UNIX_EPOCH,
    };
    assert!(store.record_step(SCOPE, "k", owner, &step).await.unwrap());
    trips("a step", 1);
    assert!(
        store
            .complete(SCOPE, "k", owner, &response_of(owner))
            .await
            .unwrap()
    );
    trips("a completion", 1);
    assert!(matches!(
        store
            .claim(&request("k", FencingToken::random()))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::Replay(_)
    ));
    trips("a replay", 0);
    let lost = FencingToken::random();
    store.claim(&request("lost", lost)).await.unwrap();
    trips("a fresh key", 1);
    clock.advance(LEASE + Duration::from_secs(1));
    let retry = FencingToken::random();
    assert!(matches!(
        store.claim(&request("lost", retry)).await.unwrap().outcome,
        ClaimOutcome::Claimed {
            takeover: Some(Takeover::LeaseLost),
            ..
        }
    ));
    trips("a takeover", 1);
}

/// SQLite's write lock, held by a connection of the test's own.
struct WriteLock(SqliteConnection);

impl WriteLock {
    async fn take(path: &str) -> Self {
        let options = SqliteStore::connect_options(path).expect("options");
        let mut conn = SqliteConnection::connect_with(&options)
            .await
            .expect("connect");
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .expect("take the write lock");
        Self(conn)
    }

    async fn release(mut self) {
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut self.0)
            .await
            .expect("release the write lock");
        self.0.close().await.expect("close");
    }
}

/// Waits until the writer's counters satisfy `ready` (they move as other tasks send
/// writes); bounded, well inside the 5 s busy timeout the blocked writer waits for.
async fn until(store: &SqliteStore, what: &str, ready: impl Fn(&GroupCommitStats) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    loop {
        let stats = store.group_commit_stats();
        if ready(&stats) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for {what}: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Claims `key`, which must be free (`why` says why it is): claimed, nothing taken over.
async fn claim_free(store: &SqliteStore, key: &str, why: &str) -> FencingToken {
    let token = FencingToken::random();
    let outcome = store.claim(&request(key, token)).await.unwrap().outcome;
    let claimed = ClaimOutcome::Claimed {
        token,
        takeover: None,
        steps: Vec::new(),
    };
    assert_eq!(outcome, claimed, "{key}: {why}");
    token
}

/// Takes SQLite's write lock and has the writer take a renewal of `key` by `owner` and
/// wait for the lock with it: every write sent until the lock is released queues for the
/// writer's next batch. The lock, the writer's counters before, the renewal.
async fn hold_the_writer(
    store: &Arc<SqliteStore>,
    path: &str,
    key: &'static str,
    owner: FencingToken,
) -> (
    WriteLock,
    GroupCommitStats,
    tokio::task::JoinHandle<Result<bool, StoreError>>,
) {
    let lock = WriteLock::take(path).await;
    let before = store.group_commit_stats();
    let renew = tokio::spawn({
        let store = store.clone();
        async move { store.renew(SCOPE, key, owner, LEASE, TTL).await }
    });
    until(store, "the writer to take the renewal", |now| {
        now.batches == before.batches + 1
    })
    .await;
    (lock, before, renew)
}

/// `key` is still in progress under `owner` (a retry finds it running), and `owner`'s
/// completion takes.
async fn still_owned_then_completed(store: &SqliteStore, key: &str, owner: FencingToken) {
    let retry = store
        .claim(&request(key, FencingToken::random()))
        .await
        .unwrap()
        .outcome;
    assert!(matches!(retry, ClaimOutcome::InProgress { .. }), "{key}");
    let done = store
        .complete(SCOPE, key, owner, &response_of(owner))
        .await
        .unwrap();
    assert!(done, "{key}: its owner completes");
}

const SHARED_KEYS: usize = 8;
const CONTENDERS: usize = 4;
const DISTINCT_KEYS: usize = 24;

fn shared(n: usize) -> String {
    format!("shared-{n}")
}

fn distinct(n: usize) -> String {
    format!("distinct-{n}")
}

/// Every third distinct key is released in the first wave and claimed anew in the second.
fn released(n: usize) -> bool {
    n.is_multiple_of(3)
}

/// What the second wave did to one shared key.
#[derive(Debug, Default)]
struct SharedKey {
    old_token: Option<FencingToken>,
    /// Retries that took over the lost lease, with their tokens.
    takeovers: Vec<FencingToken>,
    old_complete: bool,
    old_renew: bool,
}

/// Rounds of [`concurrent_writers_round`] on fresh stores until every kind of write has
/// shared a batch with another kind in some round (whether one does depends on how the
/// tasks are scheduled: on an idle machine a round can form its batches one kind at a
/// time), every guarantee checked in each round.
async fn concurrent_writers_share_batches_and_keep_every_guarantee() {
    const ROUNDS: usize = 8;
    let kinds = [
        WriteKind::Claim,
        WriteKind::TakeOver,
        WriteKind::Renew,
        WriteKind::Complete,
    ];
    let mut mixed = [false; 4];
    let mut last = None;
    for _ in 0..ROUNDS {
        let stats = concurrent_writers_round().await;
        for (seen, kind) in mixed.iter_mut().zip(kinds) {
            *seen |= stats.mixed_with(kind);
        }
        last = Some(stats);
        if mixed.iter().all(|seen| *seen) {
            return;
        }
    }
    panic!(
        "in {ROUNDS} rounds some kind never shared a batch with another (mixed: {:?} for \
         {kinds:?}); the last round: {last:?}",
        mixed
    );
}

/// One round on a fresh store: waves of claims, renewals, takeovers, completions and
/// releases at once; every guarantee asserted; the store's batching counters returned.
async fn concurrent_writers_round() -> GroupCommitStats {
    // `_dir` stays bound: dropping it deletes the database's directory.
    let Setup {
        store,
        clock,
        path,
        _dir,
    } = setup().await;
    let mut completions: HashMap<String, Vec<(FencingToken, bool)>> = HashMap::new();

    // Wave 1, as it comes: CONTENDERS claims of each shared key (the winner renews once
    // and then "crashes": it never completes), and each distinct key claimed, then
    // completed or released.
    let mut shared_claims = Vec::new();
    for k in 0..SHARED_KEYS {
        for _ in 0..CONTENDERS {
            let store = store.clone();
            shared_claims.push(tokio::spawn(async move {
                let token = FencingToken::random();
                let outcome = store
                    .claim(&request(&shared(k), token))
                    .await
                    .unwrap()
                    .outcome;
                if matches!(outcome, ClaimOutcome::Claimed { .. }) {
                    assert!(
                        store
                            .renew(SCOPE, &shared(k), token, LEASE, TTL)
                            .await
                            .unwrap()
                    );
                }
                (k, token, outcome)
            }));
        }
    }
    let mut distinct_claims = Vec::new();
    for n in 0..DISTINCT_KEYS {
        let store = store.clone();
        distinct_claims.push(tokio::spawn(async move {
            let token = claim_free(&store, &distinct(n), "a distinct key is free").await;
            let done = if released(n) {
                store.release(SCOPE, &distinct(n), token).await.unwrap()
            } else {
                store
                    .complete(SCOPE, &distinct(n), token, &response_of(token))
                    .await
                    .unwrap()
            };
            (n, token, done)
        }));
    }
    let mut keys: Vec<SharedKey> = (0..SHARED_KEYS).map(|_| SharedKey::default()).collect();
    for claim in shared_claims {
        let (k, token, outcome) = claim.await.unwrap();
        match outcome {
            ClaimOutcome::Claimed { takeover, .. } => {
                assert_eq!(takeover, None, "nothing to take over yet");
                assert!(keys[k].old_token.is_none(), "two winners of {}", shared(k));
                keys[k].old_token = Some(token);
            }
            ClaimOutcome::InProgress { .. } => {}
            other => panic!("{}: {other:?}", shared(k)),
        }
    }
    for claim in distinct_claims {
        let (n, token, done) = claim.await.unwrap();
        assert!(done, "{} released or completed by its owner", distinct(n));
        if !released(n) {
            completions
                .entry(distinct(n))
                .or_default()
                .push((token, true));
        }
    }
    let old: Vec<FencingToken> = keys
        .iter()
        .enumerate()
        .map(|(k, key)| {
            key.old_token
                .unwrap_or_else(|| panic!("no winner of {}", shared(k)))
        })
        .collect();

    // Wave 2, into shared batches: the shared keys' leases ran out; CONTENDERS retries of
    // each race to take it over while its old owner completes and renews, and the
    // released keys are claimed anew — every first write queued while the writer waits
    // for the write lock.
    let lock = WriteLock::take(&path).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let before = store.group_commit_stats();
    let mut retries = Vec::new();
    for k in 0..SHARED_KEYS {
        for _ in 0..CONTENDERS {
            let store = store.clone();
            retries.push(tokio::spawn(async move {
                let token = FencingToken::random();
                let outcome = store
                    .claim(&request(&shared(k), token))
                    .await
                    .unwrap()
                    .outcome;
                let completed = match outcome {
                    ClaimOutcome::Claimed { .. } => Some(
                        store
                            .complete(SCOPE, &shared(k), token, &response_of(token))
                            .await
                            .unwrap(),
                    ),
                    _ => None,
                };
                (k, token, outcome, completed)
            }));
        }
    }
    let mut old_owners = Vec::new();
    for (k, &token) in old.iter().enumerate() {
        let owner = store.clone();
        old_owners.push(tokio::spawn(async move {
            owner
                .complete(SCOPE, &shared(k), token, &response_of(token))
                .await
                .map(|done| (k, WriteKind::Complete, done))
        }));
        let owner = store.clone();
        old_owners.push(tokio::spawn(async move {
            owner
                .renew(SCOPE, &shared(k), token, LEASE, TTL)
                .await
                .map(|done| (k, WriteKind::Renew, done))
        }));
    }
    let mut reclaims = Vec::new();
    for n in (0..DISTINCT_KEYS).filter(|&n| released(n)) {
        let store = store.clone();
        reclaims.push(tokio::spawn(async move {
            let token = claim_free(&store, &distinct(n), "a released key is free").await;
            let done = store
                .complete(SCOPE, &distinct(n), token, &response_of(token))
                .await
                .unwrap();
            (n, token, done)
        }));
    }
    let first_writes = (SHARED_KEYS * CONTENDERS + 2 * SHARED_KEYS + reclaims.len()) as u64;
    until(&store, "every first write of wave 2 to queue", |now| {
        now.writes - before.writes + now.queued as u64 == first_writes
    })
    .await;
    lock.release().await;

    for retry in retries {
        let (k, token, outcome, completed) = retry.await.unwrap();
        match outcome {
            ClaimOutcome::Claimed { takeover, .. } => {
                assert_eq!(takeover, Some(Takeover::LeaseLost));
                keys[k].takeovers.push(token);
                let completed = completed.unwrap();
                assert!(completed, "the new owner of {} completes", shared(k));
                completions
                    .entry(shared(k))
                    .or_default()
                    .push((token, completed));
            }
            ClaimOutcome::InProgress { .. } | ClaimOutcome::Replay(_) => {}
            other => panic!("{}: {other:?}", shared(k)),
        }
    }
    for owner in old_owners {
        let (k, kind, done) = owner.await.unwrap().unwrap();
        match kind {
            WriteKind::Complete => {
                keys[k].old_complete = done;
                completions
                    .entry(shared(k))
                    .or_default()
                    .push((old[k], done));
            }
            _ => keys[k].old_renew = done,
        }
    }
    for reclaim in reclaims {
        let (n, token, done) = reclaim.await.unwrap();
        assert!(done);
        completions
            .entry(distinct(n))
            .or_default()
            .push((token, true));
    }

    let stats = store.group_commit_stats();
    assert!(stats.largest_batch > 1, "{stats:?}");

    // One owner per key: a takeover, or the old owner kept it by completing or renewing
    // first (then every takeover found the record changed and ran again).
    for (k, key) in keys.iter().enumerate() {
        assert!(key.takeovers.len() <= 1, "{}: {key:?}", shared(k));
        if key.takeovers.is_empty() {
            assert!(key.old_complete || key.old_renew, "{}: {key:?}", shared(k));
            if !key.old_complete {
                // It renewed before the takeovers: still its own, it completes now.
                let done = store
                    .complete(SCOPE, &shared(k), old[k], &response_of(old[k]))
                    .await
                    .unwrap();
                assert!(done, "{}: the old owner kept its claim", shared(k));
                completions
                    .entry(shared(k))
                    .or_default()
                    .push((old[k], done));
            }
        } else {
            assert!(
                !key.old_complete && !key.old_renew,
                "{}: {key:?}",
                shared(k)
            );
            // Fencing: the old token changes nothing any more.
            let stale = old[k];
            assert!(
                !store
                    .complete(SCOPE, &shared(k), stale, &response_of(stale))
                    .await
                    .unwrap()
            );
            assert!(
                !store
                    .renew(SCOPE, &shared(k), stale, LEASE, TTL)
                    .await
                    .unwrap()
            );
            assert!(!store.release(SCOPE, &shared(k), stale).await.unwrap());
        }
    }

    // Nothing lost, nothing doubled: each key has exactly one completion that took, and
    // replays exactly that response.
    assert_eq!(completions.len(), SHARED_KEYS + DISTINCT_KEYS);
    for (key, done) in &completions {
        let kept: Vec<_> = done.iter().filter(|(_, took)| *took).collect();
        assert_eq!(kept.len(), 1, "{key}: {done:?}");
        let outcome = store
            .claim(&request(key, FencingToken::random()))
            .await
            .unwrap()
            .outcome;
        assert_eq!(
            outcome,
            ClaimOutcome::Replay(response_of(kept[0].0)),
            "{key}"
        );
    }
    let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idempotency_records")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(records, (SHARED_KEYS + DISTINCT_KEYS) as i64);
    stats
}

async fn a_failing_write_fails_alone_in_its_batch() {
    let Setup {
        store, path, _dir, ..
    } = setup().await;
    let mut tokens = Vec::new();
    for key in ["renewed", "completed", "refused", "released"] {
        tokens.push(claim_free(&store, key, "a fresh key").await);
    }
    let [renewed, completed, refused, released] = tokens[..] else {
        unreachable!()
    };

    // The writer takes the renewal and waits for the lock with it; the rest queue.
    let (lock, before, renew) = hold_the_writer(&store, &path, "renewed", renewed).await;
    let complete = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .complete(SCOPE, "completed", completed, &response_of(completed))
                .await
        }
    });
    // A status the schema's CHECK refuses: this completion's statement fails.
    let bad = StoredResponse {
        status: 42,
        ..response_of(refused)
    };
    let refuse = tokio::spawn({
        let store = store.clone();
        async move { store.complete(SCOPE, "refused", refused, &bad).await }
    });
    let claim_token = FencingToken::random();
    let claim = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .claim(&request("new", claim_token))
                .await
                .map(|answer| answer.outcome)
        }
    });
    let release = tokio::spawn({
        let store = store.clone();
        async move { store.release(SCOPE, "released", released).await }
    });
    until(&store, "four writes to queue", |now| now.queued == 4).await;
    lock.release().await;

    assert!(renew.await.unwrap().unwrap());
    assert!(complete.await.unwrap().unwrap());
    match refuse.await.unwrap() {
        Err(StoreError::Database(sqlx::Error::Database(e))) => {
            assert!(e.message().contains("CHECK"), "{e}");
        }
        other => panic!("the refused completion's own error, got {other:?}"),
    }
    assert_eq!(
        claim.await.unwrap().unwrap(),
        ClaimOutcome::Claimed {
            token: claim_token,
            takeover: None,
            steps: Vec::new(),
        }
    );
    assert!(release.await.unwrap().unwrap());
    let stats = store.group_commit_stats();
    assert_eq!(
        stats.batches,
        before.batches + 2,
        "the four shared one batch: {stats:?}"
    );
    assert!(stats.largest_batch >= 4, "{stats:?}");

    // The others committed; the refused one wrote nothing and still owns its claim.
    assert_eq!(
        store
            .claim(&request("completed", FencingToken::random()))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::Replay(response_of(completed))
    );
    still_owned_then_completed(&store, "refused", refused).await;
    assert!(matches!(
        store
            .claim(&request("new", FencingToken::random()))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::InProgress { .. }
    ));
    let again = FencingToken::random();
    assert_eq!(
        store
            .claim(&request("released", again))
            .await
            .unwrap()
            .outcome,
        ClaimOutcome::Claimed {
            token: again,
            takeover: None,
            steps: Vec::new(),
        }
    );
}

async fn a_batch_that_fails_as_a_whole_commits_none_of_its_writes() {
    let Setup {
        store, path, _dir, ..
    } = setup().await;
    let mut tokens = Vec::new();
    for key in ["renewed", "poisoned"] {
        tokens.push(claim_free(&store, key, "a fresh key").await);
    }
    let [renewed, poisoned] = tokens[..] else {
        unreachable!()
    };
    // While this trigger exists a completion fails with an error that is not a
    // constraint (SQLite compiles the trigger into the statement and finds no such
    // function; renewals and claims set no `status` and are unaffected): such a failure
    // may have ended the transaction, so the whole batch must fail and roll back.
    sqlx::raw_sql(
        "CREATE TRIGGER poison BEFORE UPDATE OF status ON idempotency_records \
         BEGIN SELECT no_such_function(); END",
    )
    .execute(store.pool())
    .await
    .unwrap();

    let (lock, before, renew) = hold_the_writer(&store, &path, "renewed", renewed).await;
    // Queued behind the renewal, in this order: one batch of three.
    let first = FencingToken::random();
    let claim_first = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .claim(&request("first", first))
                .await
                .map(|answer| answer.outcome)
        }
    });
    until(&store, "the first claim to queue", |now| now.queued == 1).await;
    let complete = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .complete(SCOPE, "poisoned", poisoned, &response_of(poisoned))
                .await
        }
    });
    until(&store, "the completion to queue", |now| now.queued == 2).await;
    let last = FencingToken::random();
    let claim_last = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .claim(&request("last", last))
                .await
                .map(|answer| answer.outcome)
        }
    });
    until(&store, "three writes to queue", |now| now.queued == 3).await;
    lock.release().await;

    assert!(renew.await.unwrap().unwrap());
    match complete.await.unwrap() {
        Err(StoreError::Database(e)) => {
            assert!(e.to_string().contains("no_such_function"), "{e}");
        }
        other => panic!("the completion's own error, got {other:?}"),
    }
    // The claim before it had run in the transaction, the one after had not: neither
    // is answered as done.
    for claim in [claim_first, claim_last] {
        let error = claim.await.unwrap().unwrap_err();
        assert!(
            error.to_string().contains("nothing of it was committed"),
            "{error}"
        );
    }
    let stats = store.group_commit_stats();
    assert_eq!(stats.batches, before.batches + 2, "{stats:?}");
    assert!(stats.largest_batch >= 3, "{stats:?}");

    // Nothing of the batch is in the database; the writer goes on with a clean
    // connection.
    sqlx::raw_sql("DROP TRIGGER poison")
        .execute(store.pool())
        .await
        .unwrap();
    for key in ["first", "last"] {
        claim_free(&store, key, "its claim was rolled back").await;
    }
    still_owned_then_completed(&store, "poisoned", poisoned).await;
}

/// An in-memory database (`sqlite::memory:`) is a shared cache: a connection that runs
/// into another's lock is told at once instead of waiting out the busy timeout. The
/// writer waits for the lock to go, as sqlx does, so no write fails for it.
async fn an_in_memory_store_takes_many_concurrent_writers_and_readers() {
    const TASKS: usize = 64;
    const KEYS_EACH: usize = 100;
    let store = Arc::new(SqliteStore::connect("sqlite::memory:").await.expect("open"));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for k in 0..KEYS_EACH {
                let key = format!("mem-{t}-{k}");
                let token = FencingToken::random();
                let claimed = store.claim(&request(&key, token)).await?.outcome;
                assert!(matches!(claimed, ClaimOutcome::Claimed { .. }), "{key}");
                assert!(
                    store
                        .complete(SCOPE, &key, token, &response_of(token))
                        .await?
                );
                let replay = store
                    .claim(&request(&key, FencingToken::random()))
                    .await?
                    .outcome;
                assert_eq!(replay, ClaimOutcome::Replay(response_of(token)), "{key}");
            }
            Ok::<_, StoreError>(())
        }));
    }
    let mut failures = Vec::new();
    for task in tasks {
        if let Err(e) = task.await.unwrap() {
            failures.push(e.to_string());
        }
    }
    assert!(
        failures.is_empty(),
        "{} tasks failed: {failures:?}",
        failures.len()
    );
    let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idempotency_records")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(records, (TASKS * KEYS_EACH) as i64);
}

/// An app sharing its pool with the store may give back a connection inside a
/// transaction (a raw `BEGIN` it never ended). Whichever of the store's tasks takes it
/// ends that transaction first: its writes commit, visible to another connection.
async fn a_connection_handed_over_inside_a_transaction_still_commits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("shared.db");
    let path = path.to_str().expect("utf-8 path");
    let options = SqliteStore::connect_options(path).expect("options");
    let pool = SqliteStore::pool_options()
        .max_connections(1)
        .connect_with(options.clone())
        .await
        .expect("pool");
    let store = SqliteStore::from_pool_with_clock(
        pool.clone(),
        Arc::new(ManualClock::at_millis(1_700_000_000_000)),
    )
    .await
    .expect("store");
    let mut conn = pool.acquire().await.expect("the pool's one connection");
    sqlx::raw_sql("BEGIN").execute(&mut *conn).await.unwrap();
    drop(conn);
    // The writer takes the pool's one connection first (a purge has no read), then the
    // claim's read another that the pool opens.
    assert_eq!(store.purge_expired(10).await.unwrap(), 0);
    let token = claim_free(&store, "handed-over", "a fresh key").await;
    assert!(
        store
            .complete(SCOPE, "handed-over", token, &response_of(token))
            .await
            .unwrap()
    );
    let mut other = SqliteConnection::connect_with(&options)
        .await
        .expect("connect");
    let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idempotency_records")
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert_eq!(records, 1, "the claim and its completion were committed");
    other.close().await.unwrap();
}

/// The store's runtime shuts down once the writer took a write that waits for SQLite's
/// write lock. Shutting down waits for a batch in flight (Tokio waits for blocking work,
/// and the writer for the batch using its handle before sqlx gets the handle back) and
/// ends once the lock is free: nothing deadlocks (bounded), the file is sound afterwards
/// and the store reopens on it.
fn a_runtime_shut_down_mid_batch_deadlocks_nothing_and_leaves_the_file_sound() {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("shutdown.db");
    let path = path.to_str().expect("utf-8 path").to_owned();
    let store_runtime = runtime();
    let store = Arc::new(
        store_runtime
            .block_on(SqliteStore::connect(&path))
            .expect("open"),
    );
    let done = store_runtime.block_on(async {
        let token = claim_free(&store, "before", "a fresh key").await;
        store
            .complete(SCOPE, "before", token, &response_of(token))
            .await
            .unwrap()
    });
    assert!(done);

    let side = runtime();
    let lock = side.block_on(WriteLock::take(&path));
    let before = store.group_commit_stats();
    store_runtime.spawn({
        let store = store.clone();
        async move {
            let _ = store
                .claim(&request("during", FencingToken::random()))
                .await
                .map(|answer| answer.outcome);
        }
    });
    store_runtime.block_on(until(&store, "the writer to take the claim", |now| {
        now.batches == before.batches + 1
    }));
    drop(store);
    // Shut down on a thread of its own while the lock is held, then free the lock. A
    // batch already on the blocking pool is waited for; one not started yet is dropped
    // unrun. Every check below holds either way.
    let (shut, shut_down) = std::sync::mpsc::channel();
    let shutting_down = std::thread::spawn(move || {
        drop(store_runtime);
        let _ = shut.send(());
    });
    side.block_on(lock.release());
    shut_down
        .recv_timeout(Duration::from_secs(10))
        .expect("the runtime shut down: nothing deadlocked");
    shutting_down.join().expect("shut down");

    let check = runtime();
    check.block_on(async {
        let store = SqliteStore::connect(&path).await.expect("reopen");
        let integrity: String = sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(integrity, "ok");
        let replay = store
            .claim(&request("before", FencingToken::random()))
            .await
            .unwrap()
            .outcome;
        assert!(matches!(replay, ClaimOutcome::Replay(_)), "{replay:?}");
    });
}

/// The WAL keeps being reused instead of growing: SQLite's automatic checkpoints run in
/// the writer's commits. Rounds of concurrent claims and completions of large responses.
async fn the_wal_is_reused_under_writes() {
    const ROUNDS: usize = 8;
    const TASKS: usize = 16;
    const KEYS_EACH: usize = 25;
    let setup = setup().await;
    let store = &setup.store;
    let wal = std::path::PathBuf::from(format!("{}-wal", setup.path));
    let body = Bytes::from(vec![b'x'; 4096]);
    let mut wal_sizes = Vec::new();
    for round in 0..ROUNDS {
        let before = store.group_commit_stats();
        let writers: Vec<_> = (0..TASKS)
            .map(|task| {
                let store = Arc::clone(store);
                let body = body.clone();
                tokio::spawn(async move {
                    for i in 0..KEYS_EACH {
                        let key = format!("wal-{round}-{task}-{i}");
                        let token = FencingToken::random();
                        let outcome = store.claim(&request(&key, token)).await.unwrap().outcome;
                        assert!(
                            matches!(outcome, ClaimOutcome::Claimed { .. }),
                            "{outcome:?}"
                        );
                        let response = StoredResponse {
                            body: Some(body.clone()),
                            ..response_of(token)
                        };
                        assert!(store.complete(SCOPE, &key, token, &response).await.unwrap());
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.await.expect("writer task");
        }
        let written = store.group_commit_stats();
        assert!(written.batches > before.batches);
        wal_sizes.push(std::fs::metadata(&wal).expect("the WAL file").len());
    }
    // Each round writes well over 2 MiB of responses: a WAL never checkpointed would
    // hold every round's pages, one checkpointed every 1,000 pages about two rounds'.
    let first = wal_sizes[0];
    let last = *wal_sizes.last().unwrap();
    assert!(first > 2 << 20, "a round's WAL: {wal_sizes:?}");
    assert!(
        last < first * 4,
        "the WAL grew round after round instead of being reused: {wal_sizes:?}"
    );
}
