//! Time as the memory and SQLite stores see it. Postgres uses the database's own clock.
//!
//! Two timelines: wall-clock time for TTLs, which users read as calendar time, and a
//! monotonic one for the memory store's leases, so that a step of the wall clock (NTP, a
//! VM resumed) can neither expire a live lease nor keep a crashed owner's lease alive.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of time in milliseconds: wall-clock time since the Unix epoch, and a
/// monotonic count that only moves forward at the rate time passes.
///
/// Stores that keep time themselves (memory, SQLite) take one so tests can move time
/// forward instead of sleeping. All expiry decisions of one store use one clock.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Milliseconds since the Unix epoch (wall-clock time; may step).
    fn now_millis(&self) -> i64;

    /// Milliseconds on a monotonic timeline (any origin; never steps), which the memory
    /// store judges leases by. The default is [`now_millis`](Self::now_millis): a clock
    /// that gives no monotonic time of its own leaves leases exposed to its steps.
    fn monotonic_millis(&self) -> i64 {
        self.now_millis()
    }
}

/// The system clock; its monotonic time is the process's monotonic clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> i64 {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
    }

    fn monotonic_millis(&self) -> i64 {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        let origin = *ORIGIN.get_or_init(Instant::now);
        millis(origin.elapsed())
    }
}

/// A clock that only moves when told to; for tests of TTL and lease expiry, and of wall
/// clock steps ([`step_wall`](Self::step_wall)).
#[derive(Debug, Clone)]
pub struct ManualClock {
    millis: Arc<AtomicI64>,
    monotonic: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock standing at the current system time.
    pub fn new() -> Self {
        Self::at_millis(SystemClock.now_millis())
    }

    /// A clock standing at `millis` since the Unix epoch.
    pub fn at_millis(millis: i64) -> Self {
        Self {
            millis: Arc::new(AtomicI64::new(millis)),
            monotonic: Arc::new(AtomicI64::new(millis)),
        }
    }

    /// Lets `by` pass: both the wall clock and the monotonic one move forward.
    pub fn advance(&self, by: Duration) {
        let by = millis(by);
        self.millis.fetch_add(by, Ordering::SeqCst);
        self.monotonic.fetch_add(by, Ordering::SeqCst);
    }

    /// Steps the wall clock alone by `by_millis` (negative: backwards), as NTP or a VM
    /// resume does; no time passes on the monotonic clock.
    pub fn step_wall(&self, by_millis: i64) {
        self.millis.fetch_add(by_millis, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> i64 {
        self.millis.load(Ordering::SeqCst)
    }

    fn monotonic_millis(&self) -> i64 {
        self.monotonic.load(Ordering::SeqCst)
    }
}

/// Milliseconds in `d`, saturating; the unit every store keeps times in.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
