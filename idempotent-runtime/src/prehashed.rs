//! [`PassThrough`]: the hasher of maps whose keys carry a hash computed already (with a
//! keyed, HashDoS-resistant hasher), so the map does not hash them a second time.

use std::hash::Hasher;

/// Passes a key's precomputed hash through: the key's `Hash` impl writes it with
/// `write_u64`. (Other writes fold in anyway, so a key that hashes otherwise still works.)
#[derive(Debug, Default)]
pub(crate) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}
