//! Checks the protocol model with larger bounds than CI does:
//!
//! ```text
//! cargo run -p idempotent-model --release -- [--store server|in-process]
//!     [--requests N] [--crashes N] [--forgets N] [--steps N] [--at-most-once N]
//!     [--threads N] [--revert FIX]
//! ```
//!
//! `--revert` turns one fix of the protocol review off (`late-claim-check`,
//! `leases-on-monotonic`, `record-while-held`, `cache-age-from-read`), or one rule of
//! recovery points (`steps-survive-lease-loss`, `record-step-fenced`,
//! `renewal-keeps-a-ttl`, `intent-before-call`), to see the checker find what it closed.
//!
//! `--requests N` gives the second engine N retries of the first engine's request;
//! `--steps N` gives each handler N steps (0: one side effect that is not a step);
//! `--at-most-once N` makes the first N of them at most once (intent, effect, output).

use std::time::Instant;

use idempotent_model::{Protocol, Rules, StoreKind, trace};
use stateright::{Checker, Model};

fn main() {
    let mut store = StoreKind::InProcess;
    let mut requests = None;
    let mut crashes = None;
    let mut forgets = None;
    let mut steps = None;
    let mut at_most_once = 0;
    let mut threads = 2;
    let mut rules = Rules::FIXED;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        let number = || -> usize {
            value
                .parse()
                .unwrap_or_else(|_| usage(&format!("{flag} takes a number")))
        };
        match flag.as_str() {
            "--store" => {
                store = match value.as_str() {
                    "server" => StoreKind::Server,
                    "in-process" => StoreKind::InProcess,
                    _ => usage("--store is server or in-process"),
                }
            }
            "--requests" => requests = Some(number()),
            "--crashes" => crashes = Some(number()),
            "--forgets" => forgets = Some(number()),
            "--steps" => steps = Some(number()),
            "--at-most-once" => at_most_once = number(),
            "--threads" => threads = number(),
            "--revert" => match value.as_str() {
                "late-claim-check" => rules.late_claim_check = false,
                "leases-on-monotonic" => rules.leases_on_monotonic = false,
                "record-while-held" => rules.record_while_held = false,
                "cache-age-from-read" => rules.cache_age_from_read = false,
                "steps-survive-lease-loss" => rules.steps_survive_lease_loss = false,
                "record-step-fenced" => rules.record_step_fenced = false,
                "renewal-keeps-a-ttl" => rules.renewal_keeps_a_ttl = false,
                "intent-before-call" => rules.intent_before_call = false,
                _ => usage(
                    "--revert takes late-claim-check, leases-on-monotonic, record-while-held, \
                     cache-age-from-read, steps-survive-lease-loss, record-step-fenced, \
                     renewal-keeps-a-ttl or intent-before-call",
                ),
            },
            _ => usage(&format!("unknown flag {flag}")),
        }
    }
    let mut model = Protocol::ci(store);
    model.rules = rules;
    model.at_most_once = u8::try_from((1u32 << at_most_once.min(8)) - 1)
        .unwrap_or_else(|_| usage("--at-most-once is at most 8"));
    if let Some(n) = requests {
        let retries: &'static [u8] = Vec::leak(vec![0; n]);
        model.requests = [&[0], retries];
    }
    if let Some(n) = crashes {
        model.crashes = u8::try_from(n).unwrap_or_else(|_| usage("--crashes is too large"));
    }
    if let Some(n) = forgets {
        model.forgets = u8::try_from(n).unwrap_or_else(|_| usage("--forgets is too large"));
    }
    if let Some(n) = steps {
        model.steps = u8::try_from(n)
            .ok()
            .filter(|&n| n <= 8)
            .unwrap_or_else(|| usage("--steps is at most 8"));
    }
    println!("checking {model:?}");
    let started = Instant::now();
    let checker = model.checker().threads(threads).spawn_bfs().join();
    println!(
        "{} states ({} unique), depth {}, in {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    let mut failed = false;
    for property in checker.model().properties() {
        let found = checker.discovery(property.name);
        let holds = match property.expectation {
            stateright::Expectation::Sometimes => found.is_some(),
            _ => found.is_none(),
        };
        println!("{} {}", if holds { "ok  " } else { "FAIL" }, property.name);
        if let (false, Some(path)) = (holds, found) {
            println!("{}", trace(path));
        }
        failed |= !holds;
    }
    std::process::exit(i32::from(failed));
}

fn usage(message: &str) -> ! {
    eprintln!("{message}");
    eprintln!(
        "usage: idempotent-model [--store server|in-process] [--requests N] [--crashes N] [--forgets N] [--steps N] [--threads N] [--revert FIX]"
    );
    std::process::exit(2)
}
