//! Test support for [`Store`](crate::store::Store) implementations (feature `testing`): the
//! conformance suite every store must pass, and the small harness plumbing that runs it
//! as an ordinary `cargo test` target.
//!
//! Tests run through [`libtest_mimic`], so a backend that cannot be tested here (its
//! server is not configured) shows up as *ignored* in `cargo test`'s summary — never as
//! passed — with the reason printed once. A test file using it sets `harness = false`:
//!
//! ```toml
//! [[test]]
//! name = "my_store"
//! harness = false
//! ```
//!
//! and its `main` is one line; see [`conformance`] for a complete example.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

pub use libtest_mimic::{Arguments, Trial};

pub mod conformance;
pub mod faults;
pub mod protocol;

/// Runs `trials` as the test binary's tests, honouring `cargo test`'s arguments
/// (filters, `--ignored`, `--list`, …), and exits with their verdict.
pub fn run(trials: Vec<Trial>) -> ! {
    libtest_mimic::run(&Arguments::from_args(), trials).exit()
}

/// A test named `name` running `test` on a multi-thread Tokio runtime of its own, so
/// concurrency inside it is real (tasks run on several worker threads at once). A panic
/// fails the test.
pub fn async_trial<F, Fut>(name: impl Into<String>, test: F) -> Trial
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    boxed_trial(name.into(), Box::new(move || Box::pin(test())))
}

/// A test's future, boxed.
type BoxedTest = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// [`async_trial`] past the boxing: the runtime's `block_on` and the harness's wrapper
/// are compiled once for all tests, not once per test, which a test binary of hundreds
/// of trials pays for in build time.
fn boxed_trial(name: String, test: BoxedTest) -> Trial {
    Trial::test(name, move || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .expect("a Tokio runtime for the test")
            .block_on(test());
        Ok(())
    })
}

/// `trials`, each marked ignored when `unavailable` gives a reason (e.g. "the variable
/// naming the server is not set"). The reason is printed to stderr once per test binary,
/// however many groups of trials it ignores. Run them anyway with `--include-ignored`
/// (they then fail, saying what is missing).
pub fn ignored_if(unavailable: Option<String>, trials: Vec<Trial>) -> Vec<Trial> {
    let Some(reason) = unavailable else {
        return trials;
    };
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let first_time = SAID
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(reason.clone());
    if first_time {
        eprintln!("note: ignoring tests: {reason}");
    }
    trials
        .into_iter()
        .map(|trial| trial.with_ignored_flag(true))
        .collect()
}

/// Panics on purpose, as a test of what a panicking handler leaves behind does, without
/// printing the panic and its backtrace as the default hook would for a failure.
///
/// The first call installs a process-wide panic hook that passes every other panic to
/// the hook installed before it, so a test that fails still says why.
pub fn panic_deliberately(what: &'static str) -> ! {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<DeliberatePanic>().is_none() {
                previous(info);
            }
        }));
    });
    std::panic::panic_any(DeliberatePanic(what))
}

/// The payload of [`panic_deliberately`]: what the test meant to break.
#[derive(Debug, Clone, Copy)]
pub struct DeliberatePanic(pub &'static str);
