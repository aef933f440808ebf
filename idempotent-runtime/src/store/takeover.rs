//! The takeover rule: when a claim may replace a record that is already there, and why.
//!
//! Every store applies this one rule, through [`Fenced`](super::Fenced) (`fenced/rules.rs`
//! turns a record into what [`takeover`] judges), and the protocol model calls the same
//! function: no store spells it in SQL or Lua.

/// Why a claim took over an earlier record of the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Takeover {
    /// The record's TTL ran out (and, if it was still in progress, its lease too): the
    /// key counts as new, whatever the earlier request's fingerprint.
    Expired,
    /// The record was still within its TTL, but the claim holding it stopped renewing its
    /// lease (its owner crashed or stalled): a retry with the same fingerprint takes over.
    LeaseLost,
}

impl Takeover {
    /// A stable lower-case name for logs and metrics: `expired`, `lease_lost`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::LeaseLost => "lease_lost",
        }
    }
}

impl std::fmt::Display for Takeover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a claim needs to know about the record it found, as of one instant "now".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct Found {
    /// `true`: completed; `false`: in progress.
    pub completed: bool,
    /// The record's TTL ran out (`expires_at <= now`).
    pub ttl_ran_out: bool,
    /// An in-progress record's lease ran out (`lease_expires_at <= now`); ignored for a
    /// completed record.
    pub lease_ran_out: bool,
    /// The claim's fingerprint (digest and version) equals the record's.
    pub same_fingerprint: bool,
}

/// What a claim does with the record it found: the whole decision, of which the
/// takeover rule is the first step. Every store's classification goes through
/// [`decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub enum Decision {
    /// The claim takes the record over, for this reason.
    Take(Takeover),
    /// Another request used the key: `422`.
    Mismatch,
    /// Completed with the claim's fingerprint: replay it.
    Replay,
    /// Running under a live lease with the claim's fingerprint: `409` (or wait).
    InProgress,
}

/// The claim's decision for a record it found: the takeover rule first, then a
/// different fingerprint is a mismatch, then a completed record replays and an
/// in-progress one is still running.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub fn decide(found: Found) -> Decision {
    match takeover(found) {
        Some(reason) => Decision::Take(reason),
        None if !found.same_fingerprint => Decision::Mismatch,
        None if found.completed => Decision::Replay,
        None => Decision::InProgress,
    }
}

/// The takeover rule. A record may be taken over when
///
/// - its TTL ran out and nothing is running under it (completed, or its lease ran out
///   too): [`Takeover::Expired`], by any request; or
/// - it is in progress, its lease ran out, and the claim has the same fingerprint (a
///   retry of the crashed request, never another request reusing the key):
///   [`Takeover::LeaseLost`].
///
/// A live lease always wins over the TTL: a handler outliving its TTL keeps its claim as
/// long as it heartbeats.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub fn takeover(found: Found) -> Option<Takeover> {
    let running = !found.completed && !found.lease_ran_out;
    if found.ttl_ran_out && !running {
        Some(Takeover::Expired)
    } else if !found.completed && found.lease_ran_out && found.same_fingerprint {
        Some(Takeover::LeaseLost)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(completed: bool, ttl: bool, lease: bool, same: bool) -> Found {
        Found {
            completed,
            ttl_ran_out: ttl,
            lease_ran_out: lease,
            same_fingerprint: same,
        }
    }

    #[test]
    fn the_rule() {
        // Completed: only expiry frees it.
        assert_eq!(takeover(found(true, false, true, true)), None);
        assert_eq!(
            takeover(found(true, true, false, false)),
            Some(Takeover::Expired)
        );
        // In progress, lease live: never, even past the TTL.
        assert_eq!(takeover(found(false, true, false, true)), None);
        assert_eq!(takeover(found(false, false, false, true)), None);
        // In progress, lease ran out: expiry first, then same fingerprint only.
        assert_eq!(
            takeover(found(false, true, true, false)),
            Some(Takeover::Expired)
        );
        assert_eq!(
            takeover(found(false, true, true, true)),
            Some(Takeover::Expired)
        );
        assert_eq!(
            takeover(found(false, false, true, true)),
            Some(Takeover::LeaseLost)
        );
        assert_eq!(takeover(found(false, false, true, false)), None);
    }
}
