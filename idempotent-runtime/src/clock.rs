//! Time as the memory and SQLite stores see it. Postgres uses the database's own clock.
//!
//! Two timelines: wall-clock time for TTLs, which users read as calendar time, and a
//! monotonic one for leases, so that a step of the wall clock (NTP, a VM resumed) can
//! neither expire a live lease nor keep a crashed owner's lease alive. The memory store
//! lives in one process, so any monotonic clock serves it. Several processes share one
//! SQLite file, so SQLite needs a monotonic clock that is the same in every process of
//! the host: [`SystemClock`]'s, on Linux, is `CLOCK_BOOTTIME`, named by the boot it
//! counts from ([`Clock::boot_id`]).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
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

    /// The boot [`monotonic_millis`](Self::monotonic_millis) counts from, when every
    /// process of the host reads the same monotonic time until the host reboots; `None`
    /// (the default) when it is this process's own. The SQLite store, which processes
    /// share, judges leases on the monotonic clock only with a boot id, and a lease
    /// written in another boot has run out; without one it judges them on the wall clock.
    fn boot_id(&self) -> Option<u128> {
        None
    }
}

/// The system clock. Its monotonic time is, on Linux, `CLOCK_BOOTTIME` — host-wide, and
/// counting through suspend — with the kernel's boot id
/// (`/proc/sys/kernel/random/boot_id`); elsewhere it is the process's own monotonic
/// clock, with no boot id, so the SQLite store judges leases on the wall clock there.
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
        #[cfg(target_os = "linux")]
        if let Some(boot_time) = linux::boot_time_millis() {
            return boot_time;
        }
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        let origin = *ORIGIN.get_or_init(Instant::now);
        millis(origin.elapsed())
    }

    fn boot_id(&self) -> Option<u128> {
        #[cfg(target_os = "linux")]
        {
            linux::boot_id()
        }
        #[cfg(not(target_os = "linux"))]
        {
            None
        }
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::sync::OnceLock;

    /// `CLOCK_BOOTTIME` in milliseconds; `None` if the kernel refuses it (then there is
    /// no boot id either, and the monotonic time is the process's own).
    pub(super) fn boot_time_millis() -> Option<i64> {
        boot_id()?;
        read_boot_time()
    }

    fn read_boot_time() -> Option<i64> {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid, writable timespec; the call only writes it.
        let done = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
        // `time_t` and `c_long` are 32 bits on 32-bit Linux targets.
        #[allow(clippy::useless_conversion)]
        (done == 0).then(|| {
            i64::from(now.tv_sec)
                .saturating_mul(1000)
                .saturating_add(i64::from(now.tv_nsec) / 1_000_000)
        })
    }

    /// The kernel's id of this boot, read once; `None` if it cannot be read (or
    /// `CLOCK_BOOTTIME` cannot), which leaves SQLite's leases on the wall clock.
    pub(super) fn boot_id() -> Option<u128> {
        static BOOT: OnceLock<Option<u128>> = OnceLock::new();
        *BOOT.get_or_init(|| {
            read_boot_time()?;
            let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
            parse_boot_id(&text)
        })
    }

    /// A boot id as the kernel writes it (`617298e8-fdea-42c9-9783-9b747bcb03f7\n`).
    pub(super) fn parse_boot_id(text: &str) -> Option<u128> {
        let hex: String = text.trim().chars().filter(|c| *c != '-').collect();
        (hex.len() == 32)
            .then(|| u128::from_str_radix(&hex, 16).ok())
            .flatten()
    }
}

/// A clock that only moves when told to; for tests of TTL and lease expiry, of wall
/// clock steps ([`step_wall`](Self::step_wall)) and of reboots ([`reboot`](Self::reboot)).
///
/// Its clones share one time and one boot id, as the processes of one host do: stores on
/// one SQLite file given clones of it judge leases on its monotonic time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    millis: Arc<AtomicI64>,
    monotonic: Arc<AtomicI64>,
    boot: Arc<AtomicU64>,
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
            boot: Arc::new(AtomicU64::new(1)),
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

    /// As a host reboot looks: a new [`boot_id`](Clock::boot_id), and the monotonic clock
    /// starts again from zero; the wall clock does not move.
    pub fn reboot(&self) {
        self.boot.fetch_add(1, Ordering::SeqCst);
        self.monotonic.store(0, Ordering::SeqCst);
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

    fn boot_id(&self) -> Option<u128> {
        Some(u128::from(self.boot.load(Ordering::SeqCst)))
    }
}

/// Milliseconds in `d`, saturating; the unit every store keeps times in.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn the_system_clock_names_its_boot_and_counts_boot_time() {
        let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        assert_eq!(SystemClock.boot_id(), linux::parse_boot_id(&id));
        assert!(SystemClock.boot_id().is_some());
        // Boot time: since the host started, not since this process did.
        let uptime: f64 = std::fs::read_to_string("/proc/uptime")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let boot_time = SystemClock.monotonic_millis();
        assert!(
            boot_time as f64 >= uptime * 1000.0 - 1000.0,
            "{boot_time} ms, uptime {uptime} s"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn boot_ids_parse_as_the_kernel_writes_them() {
        assert_eq!(
            linux::parse_boot_id("617298e8-fdea-42c9-9783-9b747bcb03f7\n"),
            Some(0x617298e8_fdea_42c9_9783_9b747bcb03f7)
        );
        assert_eq!(linux::parse_boot_id("not a boot id"), None);
    }

    #[test]
    fn a_manual_reboot_changes_the_boot_and_restarts_monotonic_time() {
        let clock = ManualClock::at_millis(5_000);
        let boot = clock.boot_id();
        clock.reboot();
        assert_ne!(clock.boot_id(), boot);
        assert_eq!(clock.monotonic_millis(), 0);
        assert_eq!(clock.now_millis(), 5_000);
    }
}
