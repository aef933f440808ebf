//! A fuzz harness on stable Rust for the parsers that see untrusted bytes first: the
//! `Idempotency-Key` header parser, the fingerprint framing and the canonical JSON of
//! JSON-mode fingerprints. Structured generators (mutated valid headers, JSON documents
//! with escapes, duplicate keys, surrogates and deep nesting), each checked against an
//! oracle: the documented rules, the documented framing, and serde_json.
//!
//! ```text
//! cargo run --release -p idempotent-runtime --example fuzz -- --cases 10000000
//! ```
//!
//! Flags: `--cases N` (inputs in all, spread evenly over the targets; default 1,000,000),
//! `--seed S` (default: from the clock; printed), `--target key|framing|json` (only
//! one), `--case K` (replay one case of a seed, as printed for a failure). Exits non-zero
//! on any failure; a failure prints its seed, target and case.

use std::panic::AssertUnwindSafe;
use std::process::ExitCode;
use std::time::{Duration, Instant};

mod framing;
mod json;
mod key_header;
#[cfg(test)]
mod quick;
mod rng;

use rng::Rng;

/// What the code under test did with one input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Parsed: a key, or a body taken as JSON.
    Accepted,
    /// Refused: a key error, or a body fingerprinted as raw bytes.
    Refused,
}

/// A fuzz target: one generated input per call, checked by assertions.
pub(crate) struct Target {
    pub(crate) name: &'static str,
    pub(crate) run: fn(&mut Rng) -> Verdict,
}

pub(crate) const TARGETS: [Target; 3] = [
    Target {
        name: "key",
        run: key_header::run,
    },
    Target {
        name: "framing",
        run: framing::run,
    },
    Target {
        name: "json",
        run: json::run,
    },
];

/// Counts for one target.
#[derive(Debug, Default, Clone)]
pub(crate) struct Tally {
    pub(crate) inputs: u64,
    pub(crate) accepted: u64,
    pub(crate) refused: u64,
    pub(crate) failed: u64,
    pub(crate) time: Duration,
}

/// Runs `cases` inputs of `target` from `seed`, starting at case `first`; returns the
/// counts and the first failures (case and message).
pub(crate) fn fuzz(
    target: &Target,
    seed: u64,
    first: u64,
    cases: u64,
) -> (Tally, Vec<(u64, String)>) {
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    let started = Instant::now();
    for case in first..first + cases {
        let mut rng = Rng::for_case(seed ^ fnv(target.name), case);
        tally.inputs += 1;
        match std::panic::catch_unwind(AssertUnwindSafe(|| (target.run)(&mut rng))) {
            Ok(Verdict::Accepted) => tally.accepted += 1,
            Ok(Verdict::Refused) => tally.refused += 1,
            Err(panic) => {
                tally.failed += 1;
                if failures.len() < 5 {
                    let message = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_default();
                    failures.push((case, message));
                }
            }
        }
    }
    tally.time = started.elapsed();
    (tally, failures)
}

/// Separates the targets' streams under one seed.
fn fnv(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn main() -> ExitCode {
    let mut cases: u64 = 1_000_000;
    let mut seed: Option<u64> = None;
    let mut only: Option<String> = None;
    let mut one_case: Option<u64> = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        let number = |text: String| -> u64 {
            text.replace('_', "")
                .parse()
                .unwrap_or_else(|_| usage(&format!("not a number: {text}")))
        };
        match flag.as_str() {
            "--cases" => cases = number(value()),
            "--seed" => seed = Some(number(value())),
            "--target" => only = Some(value()),
            "--case" => one_case = Some(number(value())),
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown flag {other}")),
        }
    }
    let seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let targets: Vec<&'static Target> = TARGETS
        .iter()
        .filter(|t| only.as_deref().is_none_or(|name| name == t.name))
        .collect();
    if targets.is_empty() {
        usage("--target is one of key, framing, json");
    }
    // A panic is counted and reported below; the default hook would print each one too.
    std::panic::set_hook(Box::new(|_| {}));
    // The generators and the reference model recurse over nested documents.
    let worker = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || report(&targets, seed, cases, one_case))
        .expect("start the fuzz thread");
    worker.join().unwrap_or(ExitCode::FAILURE)
}

/// Runs every target, prints its counts and failures; fails if any input failed.
fn report(targets: &[&Target], seed: u64, cases: u64, one_case: Option<u64>) -> ExitCode {
    println!("fuzz: seed {seed}");
    let started = Instant::now();
    let mut total = Tally::default();
    for (i, target) in targets.iter().enumerate() {
        let (first, count) = match one_case {
            Some(case) => (case, 1),
            // Spread evenly; the first targets take the remainder.
            None => {
                let n = targets.len() as u64;
                (0, cases / n + u64::from((i as u64) < cases % n))
            }
        };
        let (tally, failures) = fuzz(target, seed, first, count);
        println!(
            "  {:<8} {:>11} inputs  {:>11} accepted  {:>11} refused  {:>3} failed  {:>7.1} s  ({:.0} inputs/s)",
            target.name,
            group(tally.inputs),
            group(tally.accepted),
            group(tally.refused),
            tally.failed,
            tally.time.as_secs_f64(),
            tally.inputs as f64 / tally.time.as_secs_f64().max(1e-9),
        );
        for (case, message) in failures {
            println!(
                "    FAILED case {case} (--seed {seed} --target {} --case {case}): {message}",
                target.name
            );
        }
        total.inputs += tally.inputs;
        total.failed += tally.failed;
    }
    println!(
        "fuzz: {} inputs, {} failed (panics and broken properties), {:.1} s",
        group(total.inputs),
        total.failed,
        started.elapsed().as_secs_f64()
    );
    if total.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `10000000` as `10,000,000`.
fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn usage(problem: &str) -> ! {
    if !problem.is_empty() {
        eprintln!("error: {problem}");
    }
    eprintln!("usage: fuzz [--cases N] [--seed S] [--target key|framing|json] [--case K]");
    std::process::exit(if problem.is_empty() { 0 } else { 2 })
}
