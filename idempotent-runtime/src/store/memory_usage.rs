//! [`MemoryUsage`]: what an in-process store or the engine's replay cache holds, as it
//! accounts for it.

/// How many records an in-process structure holds and the bytes it accounts for them
/// ([`MemoryStore::memory_usage`](super::MemoryStore::memory_usage),
/// [`Idempotency::replay_cache_usage`](crate::Idempotency::replay_cache_usage)).
///
/// The bytes are the structure's own accounting, not an allocator's measurement: each
/// says what it counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryUsage {
    /// How many records (or cache entries) it holds.
    pub records: usize,
    /// The bytes it accounts for them.
    pub bytes: usize,
}

impl MemoryUsage {
    /// The bytes accounted per record, rounded down (`None` when it holds none).
    pub fn bytes_per_record(&self) -> Option<usize> {
        self.bytes.checked_div(self.records)
    }
}
