//! Group commit on Postgres: many concurrent claims, takeovers and completions sharing
//! statements, with every guarantee checked: one winner per key, the right takeover
//! reason, completions fenced, each response on its own key. The counting proxy in front
//! of the server shows the sharing: far fewer statements reach the server than the store
//! was asked to run.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use idempotent_runtime::Store;
use idempotent_runtime::store::PostgresStore;
use idempotent_runtime::store::{ClaimOutcome, FencingToken, StoredResponse, Takeover};
use idempotent_runtime::testing::{Trial, async_trial};
use sqlx::AssertSqlSafe;
use tokio::sync::Barrier;

use super::{LEASE, TestSchema, claim_request, database_url, store_behind_counting_proxy};

pub(crate) fn trials() -> Vec<Trial> {
    vec![
        async_trial(
            "group_commit::concurrent_claims_takeovers_and_completions_share_statements",
            concurrent_claims_takeovers_and_completions_share_statements,
        ),
        async_trial(
            "group_commit::a_claim_the_server_refuses_fails_alone",
            a_claim_the_server_refuses_fails_alone,
        ),
    ]
}

/// A scope Postgres cannot store (a NUL byte in `text`) makes the server refuse the
/// whole statement it is part of; the other claims gathered with it still succeed, and
/// only that one gets the error.
async fn a_claim_the_server_refuses_fails_alone() {
    let url = database_url();
    let schema = TestSchema::new(&url).await;
    let store = Arc::new(
        PostgresStore::connect_in_schema(&url, &schema.name)
            .await
            .unwrap(),
    );
    const GOOD: usize = 40;
    let barrier = Arc::new(Barrier::new(GOOD + 1));
    let mut tasks = Vec::new();
    for i in 0..=GOOD {
        let (store, barrier) = (store.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let key = format!("k-{i}");
            let token = FencingToken::random();
            let mut request = claim_request(&key, token);
            if i == GOOD {
                request.scope = "acct\0nul";
            }
            barrier.wait().await;
            (
                i,
                token,
                store.claim(&request).await.map(|answer| answer.outcome),
            )
        }));
    }
    for task in tasks {
        match task.await.expect("task") {
            (GOOD, _, outcome) => assert!(outcome.is_err(), "{outcome:?}"),
            (i, token, outcome) => assert_eq!(
                outcome.unwrap_or_else(|e| panic!("claim {i}: {e}")),
                ClaimOutcome::Claimed {
                    token,
                    takeover: None,
                    steps: Vec::new(),
                },
            ),
        }
    }
}

/// Fresh keys, each claimed and completed.
const FRESH: usize = 128;
/// Keys each claimed by [`CONTENDERS`] requests at once.
const CONTESTED: usize = 16;
const CONTENDERS: usize = 8;
/// Keys whose holder's lease ran out, each taken over by two requests at once.
const LOST: usize = 32;
/// Completed keys whose TTL ran out, each claimed again.
const EXPIRED: usize = 32;
/// Keys in progress, each completed by its holder and, at once, by a stale token.
const HELD: usize = 32;

/// A response that names its key, so a mixed-up batch would show.
fn response_for(key: &str) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![("content-type".to_owned(), b"text/plain".to_vec())],
        body: Some(Bytes::from(key.to_owned())),
    }
}

async fn claim(store: &PostgresStore, key: &str) -> (ClaimOutcome, FencingToken) {
    let token = FencingToken::random();
    let outcome = store
        .claim(&claim_request(key, token))
        .await
        .map(|answer| answer.outcome);
    (outcome.expect("claim"), token)
}

/// What the concurrent phase saw, per group of keys.
enum Seen {
    Fresh,
    Contender(String, ClaimOutcome),
    Lost(String, ClaimOutcome),
    Expired(ClaimOutcome),
    Held { stale: bool, done: bool },
}

async fn concurrent_claims_takeovers_and_completions_share_statements() {
    let schema = TestSchema::new(&database_url()).await;
    let (store, counter) = store_behind_counting_proxy(&schema).await;
    let store = Arc::new(store);

    // Seed, one key at a time.
    for i in 0..LOST {
        let (outcome, _) = claim(&store, &format!("lost-{i}")).await;
        assert!(
            matches!(outcome, ClaimOutcome::Claimed { .. }),
            "{outcome:?}"
        );
    }
    for i in 0..EXPIRED {
        let key = format!("expired-{i}");
        let (_, token) = claim(&store, &key).await;
        assert!(
            store
                .complete("acct_alice", &key, token, &response_for("old"))
                .await
                .unwrap()
        );
    }
    let mut holders = Vec::new();
    for i in 0..HELD {
        let (outcome, token) = claim(&store, &format!("held-{i}")).await;
        assert!(
            matches!(outcome, ClaimOutcome::Claimed { .. }),
            "{outcome:?}"
        );
        holders.push(token);
    }
    // The lost leases ran out, the expired records' TTLs too (the database's clock
    // decides, so the records move back in time).
    for (prefix, column) in [("lost-", "lease_expires_at"), ("expired-", "expires_at")] {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET {column} = now() - interval '1 second' WHERE key LIKE '{prefix}%'",
            schema.table()
        )))
        .execute(store.pool())
        .await
        .unwrap();
    }

    // Everything at once.
    let tasks = FRESH + CONTESTED * CONTENDERS + LOST * 2 + EXPIRED + HELD * 2;
    let barrier = Arc::new(Barrier::new(tasks));
    let executions_before = counter.executions.load(Ordering::SeqCst);
    let mut running = Vec::with_capacity(tasks);
    let mut spawn = |job: std::pin::Pin<Box<dyn Future<Output = Seen> + Send>>| {
        let barrier = barrier.clone();
        running.push(tokio::spawn(async move {
            barrier.wait().await;
            job.await
        }));
    };
    for i in 0..FRESH {
        let store = store.clone();
        spawn(Box::pin(async move {
            let key = format!("fresh-{i}");
            let (outcome, token) = claim(&store, &key).await;
            assert_eq!(
                outcome,
                ClaimOutcome::Claimed {
                    token,
                    takeover: None,
                    steps: Vec::new(),
                }
            );
            let response = response_for(&key);
            let done = store.complete("acct_alice", &key, token, &response).await;
            assert!(done.unwrap(), "{key}: its holder's completion");
            Seen::Fresh
        }));
    }
    for i in 0..CONTESTED {
        for _ in 0..CONTENDERS {
            let store = store.clone();
            spawn(Box::pin(async move {
                let key = format!("contested-{i}");
                let (outcome, _) = claim(&store, &key).await;
                Seen::Contender(key, outcome)
            }));
        }
    }
    for i in 0..LOST {
        for _ in 0..2 {
            let store = store.clone();
            spawn(Box::pin(async move {
                let key = format!("lost-{i}");
                let (outcome, _) = claim(&store, &key).await;
                Seen::Lost(key, outcome)
            }));
        }
    }
    for i in 0..EXPIRED {
        let store = store.clone();
        spawn(Box::pin(async move {
            Seen::Expired(claim(&store, &format!("expired-{i}")).await.0)
        }));
    }
    for (i, holder) in holders.iter().copied().enumerate() {
        for stale in [false, true] {
            let store = store.clone();
            spawn(Box::pin(async move {
                let key = format!("held-{i}");
                let token = if stale {
                    FencingToken::random()
                } else {
                    holder
                };
                let response = response_for(&key);
                let done = store.complete("acct_alice", &key, token, &response).await;
                Seen::Held {
                    stale,
                    done: done.unwrap(),
                }
            }));
        }
    }
    let mut seen = Vec::with_capacity(tasks);
    for task in running {
        seen.push(task.await.expect("task"));
    }
    let executions = counter.executions.load(Ordering::SeqCst) - executions_before;
    // Fresh keys cost a claim and a completion each; every other task one operation.
    let operations = FRESH * 2 + (tasks - FRESH);

    let mut winners = std::collections::HashMap::<String, usize>::new();
    for seen in seen {
        match seen {
            Seen::Fresh => {}
            Seen::Contender(key, outcome) | Seen::Lost(key, outcome) => match outcome {
                ClaimOutcome::Claimed { takeover, .. } => {
                    let expected = key.starts_with("lost-").then_some(Takeover::LeaseLost);
                    assert_eq!(takeover, expected, "{key}");
                    *winners.entry(key).or_default() += 1;
                }
                ClaimOutcome::InProgress { retry_after } => {
                    assert!(
                        retry_after >= Duration::from_secs(1) && retry_after <= LEASE,
                        "{key}: {retry_after:?}"
                    );
                    winners.entry(key).or_default();
                }
                other => panic!("{key}: {other:?}"),
            },
            Seen::Expired(outcome) => assert!(
                matches!(
                    outcome,
                    ClaimOutcome::Claimed {
                        takeover: Some(Takeover::Expired),
                        ..
                    }
                ),
                "{outcome:?}"
            ),
            // The holder's completion lands; a stale token's is fenced off.
            Seen::Held { stale, done } => assert_eq!(done, !stale, "stale: {stale}"),
        }
    }
    assert_eq!(winners.len(), CONTESTED + LOST);
    for (key, count) in &winners {
        assert_eq!(*count, 1, "{key}: exactly one claim wins");
    }
    // Every completion landed on its own key.
    for key in (0..FRESH)
        .map(|i| format!("fresh-{i}"))
        .chain((0..HELD).map(|i| format!("held-{i}")))
    {
        match claim(&store, &key).await.0 {
            ClaimOutcome::Replay(response) => assert_eq!(response, response_for(&key)),
            other => panic!("{key}: {other:?}"),
        }
    }
    assert!(
        executions * 3 <= operations as u64,
        "{operations} operations in {executions} statements: they should share statements"
    );
}
