//! The protocol model, checked exhaustively: every invariant holds with the protocol as
//! the code runs it, and with each fix of the protocol review turned off the checker
//! finds the interleaving that fix closed (its trace is printed).
//!
//! CI's bounds: each check adds one thing to a request and its retry (a crash, a forget,
//! a forward step of the wall clock, a handler's step through a crash), which keeps the
//! whole file short enough for every test run. Their unions — two retries, a crash and a
//! forget together, handlers of two steps, wall-clock steps both ways — are the larger
//! bounds of `cargo run -p idempotent-model --release -- ...` (`src/main.rs`; the
//! commands are in the guide's checks chapter).

use idempotent_model::{Protocol, Rules, StoreKind, trace};
use stateright::{Checker, HasDiscoveries, Model};

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Checks `model` to the end and asserts every property (the invariants, and the
/// coverage properties that show the bounds reach them). Depth first: every state is
/// visited all the same, without breadth first's queue, which costs a third of the time
/// (`finds` keeps breadth first, for the shortest trace).
fn holds(model: Protocol) {
    let checker = model.checker().threads(threads()).spawn_dfs().join();
    println!(
        "{} states ({} unique), depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    for property in checker.model().properties() {
        if let (stateright::Expectation::Always, Some(path)) =
            (&property.expectation, checker.discovery(property.name))
        {
            panic!("\"{}\" broken:\n{}", property.name, trace(path));
        }
    }
    checker.assert_properties();
}

/// One request and one retry on `store`, with no crash or forget, under `rules`.
fn request_and_retry(store: StoreKind, rules: Rules) -> Protocol {
    Protocol {
        requests: [&[0], &[0]],
        crashes: 0,
        forgets: 0,
        rules,
        ..Protocol::ci(store)
    }
}

/// Checks `model` until the `expected` invariant breaks (the shortest way, breadth
/// first).
fn finds(model: Protocol, expected: &'static str) {
    let checker = model
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyOf([expected].into()))
        .spawn_bfs()
        .join();
    let Some(path) = checker.discovery(expected) else {
        panic!(
            "no counterexample for \"{expected}\" in {} states",
            checker.unique_state_count()
        );
    };
    println!("\"{expected}\" broken:\n{}", trace(path));
}

/// A request and a retry on a database store, through a crash (the retry takes the lost
/// lease over).
#[test]
fn the_protocol_holds_on_a_database_store_through_a_crash() {
    holds(Protocol {
        crashes: 1,
        steps: 0,
        ..request_and_retry(StoreKind::Server, Rules::FIXED)
    });
}

/// A request and a retry on a database store, and the operator forgets the key (a replay
/// cache may still hold it).
#[test]
fn the_protocol_holds_on_a_database_store_through_a_forget() {
    holds(Protocol {
        forgets: 1,
        steps: 0,
        ..request_and_retry(StoreKind::Server, Rules::FIXED)
    });
}

/// A request and a retry on an in-process store whose wall clock steps forward by more
/// than a lease.
#[test]
fn the_protocol_holds_on_an_in_process_store_whose_wall_clock_steps_forward() {
    holds(Protocol {
        steps: 0,
        wall_steps: &[4],
        ..request_and_retry(StoreKind::InProcess, Rules::FIXED)
    });
}

/// A handler of one step (which may return a 5xx after it), a retry, and a crash.
#[test]
fn the_protocol_holds_on_a_database_store_for_a_handler_of_a_step_through_a_crash() {
    holds(Protocol {
        crashes: 1,
        steps: 1,
        ..request_and_retry(StoreKind::Server, Rules::FIXED)
    });
}

#[test]
fn without_the_late_claim_check_a_claim_answered_after_its_lease_runs_twice() {
    finds(
        request_and_retry(
            StoreKind::Server,
            Rules {
                late_claim_check: false,
                ..Rules::FIXED
            },
        ),
        "one side effect per step per lease of a record lifetime",
    );
}

#[test]
fn without_monotonic_leases_a_wall_step_hands_a_live_key_to_a_retry() {
    finds(
        request_and_retry(
            StoreKind::InProcess,
            Rules {
                leases_on_monotonic: false,
                ..Rules::FIXED
            },
        ),
        "no takeover from a live holder",
    );
}

#[test]
fn without_monotonic_leases_a_backward_wall_step_keeps_a_lease_beyond_its_length() {
    finds(
        Protocol {
            requests: [&[0], &[]],
            wall_steps: &[-4],
            ..request_and_retry(
                StoreKind::InProcess,
                Rules {
                    leases_on_monotonic: false,
                    ..Rules::FIXED
                },
            )
        },
        "leases always run out",
    );
}

#[test]
fn without_recording_while_held_an_engine_abandons_an_answer_it_could_record() {
    finds(
        Protocol {
            requests: [&[0], &[]],
            ..request_and_retry(
                StoreKind::Server,
                Rules {
                    record_while_held: false,
                    ..Rules::FIXED
                },
            )
        },
        "answers are recorded while the key is held",
    );
}

#[test]
fn without_counting_the_cache_age_from_the_read_a_forgotten_record_is_replayed_too_long() {
    finds(
        Protocol {
            requests: [&[0], &[0, 0]],
            forgets: 1,
            ..request_and_retry(
                StoreKind::Server,
                Rules {
                    cache_age_from_read: false,
                    ..Rules::FIXED
                },
            )
        },
        "replays are the record",
    );
}

#[test]
fn without_steps_surviving_a_lost_lease_a_resumed_request_runs_a_recorded_step_again() {
    finds(
        request_and_retry(
            StoreKind::Server,
            Rules {
                steps_survive_lease_loss: false,
                ..Rules::FIXED
            },
        ),
        "recorded steps are not run again",
    );
}

#[test]
fn without_fencing_record_step_a_stale_execution_records_a_step_twice() {
    finds(
        request_and_retry(
            StoreKind::Server,
            Rules {
                record_step_fenced: false,
                ..Rules::FIXED
            },
        ),
        "one recorded output per step",
    );
}

/// Issue 44, item 1: renewals that keep the record only to the end of the lease let a
/// handler that outlived its TTL and crashed leave a record that expires with its lease,
/// so the retry of its request runs the recorded steps again.
#[test]
fn without_renewals_keeping_a_ttl_a_crash_after_the_ttl_loses_the_recorded_steps() {
    finds(
        Protocol {
            crashes: 1,
            ..request_and_retry(
                StoreKind::Server,
                Rules {
                    renewal_keeps_a_ttl: false,
                    ..Rules::FIXED
                },
            )
        },
        "steps outlive their owner by a TTL",
    );
}

/// Issue 48: a handler of one at-most-once step, a retry and a crash, on a database
/// store: the step's side effect happens at most once per record lifetime through
/// crashes and lost calls between its intent, its effect and its output, and an effect
/// whose output was lost is verified rather than repeated.
#[test]
fn the_protocol_holds_for_an_at_most_once_step_through_a_crash() {
    holds(Protocol {
        crashes: 1,
        steps: 1,
        at_most_once: 1,
        ..request_and_retry(StoreKind::Server, Rules::FIXED)
    });
}

/// Issue 48: without the intent recorded before the call, an at-most-once step is an
/// at-least-once one: a crash between its effect and its record makes the retry act
/// again.
#[test]
fn without_the_intent_an_at_most_once_step_acts_twice() {
    finds(
        Protocol {
            crashes: 1,
            steps: 1,
            at_most_once: 1,
            ..request_and_retry(
                StoreKind::Server,
                Rules {
                    intent_before_call: false,
                    ..Rules::FIXED
                },
            )
        },
        "at-most-once steps act once per record lifetime",
    );
}
