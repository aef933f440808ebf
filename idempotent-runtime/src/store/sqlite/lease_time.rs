//! The clock SQLite's leases are on.
//!
//! Several processes of a host share one SQLite file, so a lease must be judged on a
//! clock that every one of them reads alike and that a step of the wall clock (NTP, a VM
//! resumed) cannot move. That is the store clock's monotonic time when the clock names
//! the boot it counts from ([`Clock::boot_id`]; [`SystemClock`](crate::clock::SystemClock) on
//! Linux: `CLOCK_BOOTTIME` and the kernel's boot id). A lease is stored with the boot it
//! was written in (`lease_boot_id`) and its end on that boot's clock
//! (`lease_ends_boot_ms`). **A lease written in another boot has run out**: the host
//! rebooted, so no handler of that boot still runs, and the new boot's clock starts
//! again from zero.
//!
//! A clock with no boot id (SQLite on other systems, an injected clock that has none)
//! leaves leases on the wall clock, as are leases written before migration 0002: those
//! are stored without a boot (`lease_boot_id` NULL) and judged on `lease_expires_at`.
//!
//! `lease_expires_at` is always written too, on the wall clock: it is what a lease is
//! judged on without a boot. TTLs (`expires_at`, `created_at`) are wall-clock time, which
//! users read as calendar time: a wall step moves them.
//!
//! A record read places its lease on the lease clock of the read's [`Now`]
//! (`records.rs`, `lease_end`); the engine judges it there.

use std::time::Duration;

use crate::clock::{Clock, millis};

/// One instant of the store's clock, as SQLite's statements take it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Now {
    /// Wall-clock milliseconds since the Unix epoch: TTLs, `created_at`, and
    /// `lease_expires_at`.
    pub(super) wall: i64,
    /// The boot whose monotonic clock leases are judged on, big-endian; `None`: on the
    /// wall clock.
    pub(super) boot_id: Option<[u8; 16]>,
    /// Milliseconds on that boot's monotonic clock (the wall clock without a boot).
    pub(super) boot: i64,
}

impl Now {
    /// Reads `clock` once.
    pub(super) fn of(clock: &dyn Clock) -> Self {
        let wall = clock.now_millis();
        match clock.boot_id() {
            Some(id) => Self {
                wall,
                boot_id: Some(id.to_be_bytes()),
                boot: clock.monotonic_millis(),
            },
            None => Self {
                wall,
                boot_id: None,
                boot: wall,
            },
        }
    }

    /// The end of a lease of `lease` from now on the wall clock (`lease_expires_at`).
    pub(super) fn lease_expires_at(&self, lease: Duration) -> i64 {
        self.wall.saturating_add(millis(lease))
    }

    /// The end of a lease of `lease` from now on the boot's clock (`lease_ends_boot_ms`);
    /// `None` without a boot.
    pub(super) fn lease_ends_boot(&self, lease: Duration) -> Option<i64> {
        self.boot_id
            .map(|_| self.boot.saturating_add(millis(lease)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_without_a_boot_judges_leases_on_the_wall_clock() {
        #[derive(Debug)]
        struct Wall;
        impl Clock for Wall {
            fn now_millis(&self) -> i64 {
                1_000
            }
            fn monotonic_millis(&self) -> i64 {
                7
            }
        }
        let now = Now::of(&Wall);
        assert_eq!((now.boot_id, now.boot), (None, 1_000));
        assert_eq!(now.lease_ends_boot(Duration::from_secs(1)), None);
        assert_eq!(now.lease_expires_at(Duration::from_secs(1)), 2_000);
    }
}
