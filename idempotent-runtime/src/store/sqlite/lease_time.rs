//! The clock SQLite's leases are judged on, and the one rule that judges them.
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
//! The rule is one SQL expression, [`lease_left_ms`], which the statements name as
//! `lease_left_ms(?wall_now, ?boot_id, ?boot_now)` and [`expand`] writes out.

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

/// The lease rule, as SQL: how many milliseconds the record's lease has left, judged
/// with `wall` (now on the wall clock), `boot_id` (the boot leases are judged in, or
/// NULL) and `boot` (now on that boot's clock), each a parameter such as `?3`. `<= 0`:
/// the lease ran out. NULL: no lease (a completed record).
///
/// - written or judged without a boot: on the wall clock, `lease_expires_at - wall` (a
///   process that cannot read the boot falls back to the wall clock rather than take a
///   lease written with one for run out);
/// - written in this boot: on its monotonic clock, `lease_ends_boot_ms - boot`;
/// - written in another boot: ran out, `0`.
pub(super) fn lease_left_ms(wall: &str, boot_id: &str, boot: &str) -> String {
    format!(
        "(CASE WHEN lease_boot_id IS NULL OR {boot_id} IS NULL THEN lease_expires_at - {wall} \
         WHEN lease_boot_id = {boot_id} THEN lease_ends_boot_ms - {boot} \
         ELSE 0 END)"
    )
}

/// `template` with every `lease_left_ms(a, b, c)` written out as [`lease_left_ms`].
///
/// # Panics
///
/// On a call without its three arguments (a mistake in a statement file, caught by the
/// first test that runs it).
pub(super) fn expand(template: &str) -> String {
    const CALL: &str = "lease_left_ms(";
    let mut out = String::with_capacity(template.len() + 256);
    let mut rest = template;
    while let Some(at) = rest.find(CALL) {
        out.push_str(&rest[..at]);
        let args_start = at + CALL.len();
        let close = rest[args_start..]
            .find(')')
            .map(|i| args_start + i)
            .unwrap_or_else(|| panic!("unclosed lease_left_ms( in {template}"));
        let args: Vec<&str> = rest[args_start..close].split(',').map(str::trim).collect();
        let [wall, boot_id, boot] = args[..] else {
            panic!("lease_left_ms takes three arguments: {template}");
        };
        out.push_str(&lease_left_ms(wall, boot_id, boot));
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

/// A statement file with the lease rule written out, built once: a `&'static str` with
/// one address for the store's prepared-statement caches.
macro_rules! statement {
    ($file:literal) => {{
        static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            $crate::store::sqlite::lease_time::expand(include_str!($file))
        });
        SQL.as_str()
    }};
}
pub(super) use statement;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_every_call_with_its_own_parameters() {
        let sql = expand("SELECT lease_left_ms(?3, ?6, ?7) <= 0, lease_left_ms(?1,?2,?4)");
        assert!(!sql.contains("lease_left_ms("));
        assert!(sql.contains("lease_boot_id IS NULL OR ?6 IS NULL THEN lease_expires_at - ?3"));
        assert!(sql.contains("lease_boot_id = ?6 THEN lease_ends_boot_ms - ?7"));
        assert!(sql.contains("lease_boot_id = ?2 THEN lease_ends_boot_ms - ?4"));
        assert!(sql.ends_with("END)"));
    }

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
