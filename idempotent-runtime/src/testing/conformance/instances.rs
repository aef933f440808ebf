//! Conformance checks of several instances of an app on one backend: stores opened by
//! [`Harness::another_store`](super::Harness::another_store), each with its own pool,
//! connection or client, racing on the records they share. A backend without another
//! store passes them without racing anything.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;

use super::{
    Backend, Instance, LEASE, SCOPE, claim_in, concurrent_claims, exactly_one_winner, fp,
    must_claim, race_claims_against_fenced_writes, response, setup,
};
use crate::store::{ClaimOutcome, RecordedStep, Store, Takeover};

/// How many instances the checks race: the harness's store and three more.
const INSTANCES: usize = 4;

/// `first` and `INSTANCES - 1` more stores on its backend, or `None` when the backend has
/// no other store.
async fn instances(h: &dyn Instance, first: &Arc<dyn Store>) -> Option<Vec<Arc<dyn Store>>> {
    let mut stores = vec![Arc::clone(first)];
    for _ in 1..INSTANCES {
        stores.push(h.another_store().await?);
    }
    Some(stores)
}

/// 64 simultaneous claims of one key spread over four instances, six rounds (six keys,
/// on a cluster most likely on different nodes), every third round a takeover of a
/// crashed owner's claim (its lease ran out): exactly one claim wins each round, every
/// other one is told the request is in progress, and once the winner completed through
/// another instance than most claimers', every instance replays its response.
pub async fn check_instances_concurrent_claims_one_winner(backend: Backend) {
    const CLAIMS: usize = 64;
    let (h, store) = setup(backend).await;
    let Some(stores) = instances(&*h, &store).await else {
        return;
    };
    for round in 0..6 {
        let key = format!("race-{round}");
        let takeover = (round % 3 == 2).then_some(Takeover::LeaseLost);
        if takeover.is_some() {
            must_claim(&*stores[0], SCOPE, &key, fp(1)).await;
            h.advance(LEASE).await;
        }
        let outcomes = concurrent_claims(&stores, CLAIMS, |_| key.clone()).await;
        let winner = exactly_one_winner(&outcomes, takeover);
        let completed = stores[INSTANCES - 1]
            .complete(SCOPE, &key, winner, &response("won"))
            .await
            .expect("complete");
        assert!(completed, "round {round}: the winner completes");
        for (i, store) in stores.iter().enumerate() {
            let (outcome, _) = claim_in(&**store, SCOPE, &key, fp(1)).await;
            assert_eq!(
                outcome,
                ClaimOutcome::Replay(response("won")),
                "round {round}: instance {i} replays the winner's response"
            );
        }
    }
}

/// The race of [`check_claims_racing_fenced_writes_never_fail`](super::check_claims_racing_fenced_writes_never_fail)
/// over four instances, each key's claimers spread over all four, so that the claim
/// batches of several instances run at once too: never an error, never two owners of a
/// key, and every fenced write of an owner takes effect.
pub async fn check_instances_claims_racing_fenced_writes_never_fail(backend: Backend) {
    let (h, store) = setup(backend).await;
    let Some(stores) = instances(&*h, &store).await else {
        return;
    };
    race_claims_against_fenced_writes(&stores).await;
}

/// Each of 150 old owners (per round, four rounds) records a second step at the moment a
/// claim through another instance takes its record over for the lost lease, all keys at
/// once: whatever the interleaving, the step is either in the takeover's answer (it was
/// recorded first) or refused, never recorded yet missing from the answer (what a
/// takeover that reads the steps from a snapshot older than the row it writes gives),
/// and the record holds what the takeover answered.
pub async fn check_instances_steps_racing_takeovers_are_answered_or_fenced(backend: Backend) {
    const KEYS: usize = 150;
    let (h, old) = setup(backend).await;
    let Some(new) = h.another_store().await else {
        return;
    };
    let (first, second) = (step("first", "1"), step("second", "2"));
    for round in 0..4 {
        let mut owners = Vec::new();
        for i in 0..KEYS {
            let key = format!("race-{round}-{i}");
            let token = must_claim(&*old, SCOPE, &key, fp(1)).await;
            let recorded = old.record_step(SCOPE, &key, token, &first).await;
            assert!(recorded.expect("record_step"), "{key}: the owner records");
            owners.push((key, token));
        }
        h.advance(LEASE).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(2 * KEYS));
        let races: Vec<_> = owners
            .into_iter()
            .map(|(key, token)| {
                let recording = tokio::spawn({
                    let (old, key, second, barrier) = (
                        Arc::clone(&old),
                        key.clone(),
                        second.clone(),
                        Arc::clone(&barrier),
                    );
                    async move {
                        barrier.wait().await;
                        let recorded = old.record_step(SCOPE, &key, token, &second).await;
                        recorded.expect("the old owner's record_step")
                    }
                });
                let claiming = tokio::spawn({
                    let (new, key, barrier) = (Arc::clone(&new), key.clone(), Arc::clone(&barrier));
                    async move {
                        barrier.wait().await;
                        claim_in(&*new, SCOPE, &key, fp(1)).await
                    }
                });
                (key, recording, claiming)
            })
            .collect();
        for (key, recording, claiming) in races {
            let recorded = recording.await.expect("step task");
            let (outcome, token) = claiming.await.expect("claim task");
            let expected = if recorded {
                vec![first.clone(), second.clone()]
            } else {
                vec![first.clone()]
            };
            assert_eq!(
                outcome,
                ClaimOutcome::Claimed {
                    token,
                    takeover: Some(Takeover::LeaseLost),
                    steps: expected.clone(),
                },
                "{key}: the old owner's step was recorded: {recorded}"
            );
            let info = new.inspect(SCOPE, &key).await.expect("inspect");
            let steps = info.expect("live").steps;
            assert_eq!(steps, expected, "{key}: the record holds the answer");
        }
    }
}

/// A step named `name` whose output says `output`.
fn step(name: &str, output: &str) -> RecordedStep {
    RecordedStep {
        name: name.to_owned(),
        output: Bytes::from(output.to_owned()),
        recorded_at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_000),
    }
}
