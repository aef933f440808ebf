//! The fuzz harness (key parser, fingerprint framing, canonical JSON) on a few thousand
//! inputs per target, in the default test run (the example is built as a test too). The
//! long run is `cargo run --release -p idempotent-runtime --example fuzz -- --cases 10000000`.

use crate::{TARGETS, fuzz};

/// Fixed, so a failure here reproduces with `--seed 20250101 --target T --case K`.
const SEED: u64 = 20_250_101;

#[test]
fn every_target_passes_its_properties_on_generated_inputs() {
    // The generators recurse over documents nested thousands deep.
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(run_every_target)
        .expect("spawn")
        .join()
        .expect("the targets pass");
}

fn run_every_target() {
    for target in &TARGETS {
        let cases = if target.name == "json" { 6_000 } else { 7_000 };
        let (tally, failures) = fuzz(target, SEED, 0, cases);
        assert!(
            failures.is_empty(),
            "{}: {} of {} inputs failed; first: {failures:?}",
            target.name,
            tally.failed,
            tally.inputs
        );
        assert_eq!(tally.inputs, cases);
        // The generators reach both sides of each parser.
        assert!(
            tally.accepted > cases / 10 && tally.refused > cases / 10,
            "{}: {tally:?}",
            target.name
        );
    }
}
