//! The preloaded records' keys, scope and request, shared with the wrk scripts
//! (`../wrk/*.lua` compute the same keys).

/// The caller every request comes from (`Authorization: Bearer <SCOPE>`), and so the
/// scope of every record: 21 characters, about the length of a payment provider's account
/// id.
pub const SCOPE: &str = "acct_1Pq8ZxL2mN4vR7tY";

/// The request body: the HTTP benchmark's 1 KiB order.
pub const ORDER: &[u8] = include_bytes!("../../http/wrk/order.json");

/// The multiplier that scatters keys: odd, so `i * SCATTER mod 2^32` differs for every
/// `i` below 2^32, and small enough that the product stays exact in Lua's doubles.
pub const SCATTER: u64 = 2_654_435;

/// The `i`-th preloaded key: 36 characters shaped like a UUID, whose first 8 hex digits
/// are scattered so that consecutive keys land far apart in a key index (as random
/// client keys do), and whose last 12 digits are `i`. Every store's bulk load computes
/// the same string in SQL, and `wrk/replay.lua` in Lua.
pub fn key(i: u64) -> String {
    format!("{:08x}-0000-4000-8000-{i:012}", (i * SCATTER) % (1 << 32))
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_are_uuid_shaped_and_scattered() {
        assert_eq!(super::key(0), "00000000-0000-4000-8000-000000000000");
        assert_eq!(super::key(1), "002880e3-0000-4000-8000-000000000001");
        assert_eq!(super::key(1).len(), 36);
    }
}
