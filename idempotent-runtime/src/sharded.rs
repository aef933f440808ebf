//! [`Sharded`]: state by `(scope, key)` split over independently locked shards, the one
//! copy the memory store, the replay cache and the waiting registry each build on.
//!
//! A request's `(scope, key)` is hashed once, with a keyed hasher (ids come from clients,
//! so the hash must not be predictable): the hash picks the shard ([`Sharded::lock`]) and
//! is the shard table's own hash ([`Table`]), where an entry is found by comparing the
//! borrowed strings with the [`Id`] it keeps, so that a lookup allocates nothing.

use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard};

use hashbrown::HashTable;
use hashbrown::hash_table::{Entry, OccupiedEntry};

/// `count` independently locked shards of `T`, and the keyed hasher that places an id in
/// one of them.
///
/// A panic while a shard is locked leaves it as the panicking code left it (the lock is
/// not poisoned for later callers): every user changes its shard in steps that each leave
/// it consistent.
#[derive(Debug)]
pub(crate) struct Sharded<T> {
    hasher: RandomState,
    shards: Box<[Mutex<T>]>,
}

impl<T> Sharded<T> {
    /// `count` shards, each made by `shard`.
    pub(crate) fn new(count: usize, shard: impl FnMut() -> T) -> Self {
        assert!(count > 0, "at least one shard");
        Self {
            hasher: RandomState::new(),
            shards: std::iter::repeat_with(shard)
                .take(count)
                .map(Mutex::new)
                .collect(),
        }
    }

    /// `(scope, key)` with its hash: what every lookup of it in this map carries.
    pub(crate) fn id<'a>(&self, scope: &'a str, key: &'a str) -> HashedId<'a> {
        HashedId {
            // Hashed as a `(&str, &str)`: each part's length goes in, so ("ab", "c") and
            // ("a", "bc") hash apart.
            hash: self.hasher.hash_one((scope, key)),
            scope,
            key,
        }
    }

    /// The shard of `id`, locked.
    pub(crate) fn lock(&self, id: HashedId<'_>) -> MutexGuard<'_, T> {
        lock(&self.shards[self.index(id.hash)])
    }

    /// The shard an id hashed `hash` lives in, locked.
    pub(crate) fn lock_hash(&self, hash: u64) -> MutexGuard<'_, T> {
        lock(&self.shards[self.index(hash)])
    }

    /// Every shard, each locked in turn (never two at once).
    pub(crate) fn each(&self) -> impl Iterator<Item = MutexGuard<'_, T>> {
        self.shards.iter().map(lock)
    }

    /// Which shard holds ids hashed `hash`: bits 32.. pick it, because a [`Table`] uses
    /// the low bits for the bucket and the top seven for its control bytes, which must
    /// stay spread within a shard.
    fn index(&self, hash: u64) -> usize {
        // Bits 32..64 fit a `usize` on the 64-bit targets this runs on; on a 32-bit one
        // the truncation keeps bits 32..64 of the hash anyway.
        #[allow(clippy::cast_possible_truncation)]
        let high = (hash >> 32) as usize;
        high % self.shards.len()
    }
}

fn lock<T>(shard: &Mutex<T>) -> MutexGuard<'_, T> {
    shard.lock().unwrap_or_else(|e| e.into_inner())
}

/// A borrowed `(scope, key)` and its hash in one [`Sharded`] map (another map's hasher
/// gives another hash).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HashedId<'a> {
    hash: u64,
    scope: &'a str,
    key: &'a str,
}

impl HashedId<'_> {
    /// Its hash in the map that made it.
    pub(crate) fn hash(self) -> u64 {
        self.hash
    }
}

/// The `(scope, key)` an entry keeps, with its hash, in one allocation; its owner may keep
/// bytes of its own after the id in the same allocation ([`Id::replace_tail`]).
#[derive(Debug)]
pub(crate) struct Id {
    hash: u64,
    /// The scope, the key, then the owner's bytes.
    text: Box<[u8]>,
    scope_len: u32,
    id_len: u32,
}

impl Id {
    /// An owned copy of `id`.
    pub(crate) fn new(id: HashedId<'_>) -> Self {
        let text: Box<[u8]> = [id.scope.as_bytes(), id.key.as_bytes()].concat().into();
        Self {
            hash: id.hash,
            scope_len: len_u32(id.scope.len()),
            id_len: len_u32(text.len()),
            text,
        }
    }

    /// Whether this is `id`. Scope and key are compared apart: ("ab", "c") is not
    /// ("a", "bc").
    pub(crate) fn is(&self, id: HashedId<'_>) -> bool {
        let (scope, key) = self.id_bytes().split_at(self.scope_len as usize);
        self.hash == id.hash && scope == id.scope.as_bytes() && key == id.key.as_bytes()
    }

    /// Whether `other` is the same id.
    fn same(&self, other: &Id) -> bool {
        self.hash == other.hash
            && self.scope_len == other.scope_len
            && self.id_bytes() == other.id_bytes()
    }

    /// Its hash in the map that made it.
    pub(crate) fn hash(&self) -> u64 {
        self.hash
    }

    /// The scope and the key.
    pub(crate) fn scope_and_key(&self) -> (&str, &str) {
        let (scope, key) = self.id_bytes().split_at(self.scope_len as usize);
        // Both were `str`s, joined at `scope_len`: no split falls inside a character.
        let text = |bytes| std::str::from_utf8(bytes).expect("an id is UTF-8");
        (text(scope), text(key))
    }

    /// The scope followed by the key.
    pub(crate) fn id_bytes(&self) -> &[u8] {
        &self.text[..self.id_len as usize]
    }

    /// The owner's bytes after the id (empty until [`replace_tail`](Self::replace_tail)).
    pub(crate) fn tail(&self) -> &[u8] {
        &self.text[self.id_len as usize..]
    }

    /// Replaces the text with `text`: [`id_bytes`](Self::id_bytes), then the owner's
    /// bytes.
    pub(crate) fn replace_tail(&mut self, text: Box<[u8]>) {
        assert!(text.starts_with(self.id_bytes()), "the id stays in front");
        self.text = text;
    }
}

/// A length in an [`Id`]: the engine bounds scopes and keys far below 4 GiB.
fn len_u32(len: usize) -> u32 {
    u32::try_from(len).expect("an id below 4 GiB")
}

/// What a [`Table`] holds: an entry that keeps its [`Id`].
pub(crate) trait Identified {
    /// The id the entry is found by.
    fn id(&self) -> &Id;
}

/// One shard's entries, found by the hash each [`Id`] carries and compared in place with
/// a borrowed id; a table that grows rehashes only its shard's entries, by those hashes.
#[derive(Debug)]
pub(crate) struct Table<E> {
    entries: HashTable<E>,
}

impl<E> Default for Table<E> {
    fn default() -> Self {
        Self {
            entries: HashTable::new(),
        }
    }
}

impl<E: Identified> Table<E> {
    /// The entry of `id`.
    pub(crate) fn get(&self, id: HashedId<'_>) -> Option<&E> {
        self.entries.find(id.hash, |e| e.id().is(id))
    }

    /// The entry of `id`, to change (not its id).
    pub(crate) fn get_mut(&mut self, id: HashedId<'_>) -> Option<&mut E> {
        self.entries.find_mut(id.hash, |e| e.id().is(id))
    }

    /// The slot of `id`: its entry, or where one goes (which must be `id`'s).
    pub(crate) fn entry(&mut self, id: HashedId<'_>) -> Entry<'_, E> {
        self.entries
            .entry(id.hash, |e| e.id().is(id), |e| e.id().hash())
    }

    /// Puts `entry` in, in place of the one with its id, if any (returned).
    pub(crate) fn insert(&mut self, entry: E) -> Option<E> {
        let hash = entry.id().hash();
        let slot = self
            .entries
            .entry(hash, |e| e.id().same(entry.id()), |e| e.id().hash());
        match slot {
            Entry::Occupied(mut occupied) => Some(std::mem::replace(occupied.get_mut(), entry)),
            Entry::Vacant(vacant) => {
                vacant.insert(entry);
                None
            }
        }
    }

    /// Removes the entry of `id`, if any.
    pub(crate) fn remove(&mut self, id: HashedId<'_>) -> Option<E> {
        self.remove_if(id, |_| true)
    }

    /// Removes the entry of `id` if `removable` says so.
    pub(crate) fn remove_if(
        &mut self,
        id: HashedId<'_>,
        removable: impl FnOnce(&E) -> bool,
    ) -> Option<E> {
        let found = self.entries.find_entry(id.hash, |e| e.id().is(id)).ok()?;
        removable(found.get()).then(|| found.remove().0)
    }

    /// The entry among those hashed `hash` that `which` picks: for an owner that knows
    /// its entry by something of its own instead of the id.
    pub(crate) fn find(&self, hash: u64, which: impl FnMut(&E) -> bool) -> Option<&E> {
        self.entries.find(hash, which)
    }

    /// [`find`](Self::find), to remove it.
    pub(crate) fn find_entry(
        &mut self,
        hash: u64,
        which: impl FnMut(&E) -> bool,
    ) -> Option<OccupiedEntry<'_, E>> {
        self.entries.find_entry(hash, which).ok()
    }

    /// How many entries it holds.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Its entries, in no order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &E> {
        self.entries.iter()
    }

    /// How many entries it has room for before it grows.
    pub(crate) fn capacity(&self) -> usize {
        self.entries.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Counter {
        id: Id,
        count: u32,
    }

    impl Identified for Counter {
        fn id(&self) -> &Id {
            &self.id
        }
    }

    /// Counts `(scope, key)` once more; its count after.
    fn bump(map: &Sharded<Table<Counter>>, scope: &str, key: &str) -> u32 {
        let id = map.id(scope, key);
        let mut shard = map.lock(id);
        let counter = shard.entry(id).or_insert_with(|| Counter {
            id: Id::new(id),
            count: 0,
        });
        let counter = counter.into_mut();
        counter.count += 1;
        counter.count
    }

    #[test]
    fn scope_and_key_are_framed_apart() {
        let map = Sharded::new(4, Table::default);
        for (scope, key) in [("ab", "c"), ("a", "bc"), ("", "abc"), ("abc", "")] {
            assert_eq!(bump(&map, scope, key), 1, "{scope:?} {key:?}");
        }
        assert_eq!(bump(&map, "a", "bc"), 2);
        assert_eq!(map.each().map(|shard| shard.len()).sum::<usize>(), 4);
        let id = Id::new(map.id("ab", "c"));
        assert!(id.is(map.id("ab", "c")));
        assert!(!id.is(map.id("a", "bc")));
        assert!(!id.is(map.id("ab", "")));
        assert_eq!(id.id_bytes(), b"abc");
        assert_eq!(id.scope_and_key(), ("ab", "c"));
    }

    #[test]
    fn one_id_hashes_alike_and_lives_in_one_shard() {
        let map: Sharded<Table<Counter>> = Sharded::new(8, Table::default);
        let keys: Vec<String> = (0..2_000).map(|i| format!("key-{i}")).collect();
        for key in &keys {
            assert_eq!(map.id("s", key).hash(), map.id("s", key).hash());
            bump(&map, "s", key);
        }
        for key in &keys {
            let id = map.id("s", key);
            assert_eq!(map.lock(id).get(id).map(|c| c.count), Some(1), "{key}");
            assert_eq!(map.lock_hash(id.hash()).get(id).map(|c| c.count), Some(1));
        }
        // Every shard gets some of 2,000 ids (the hash's bits 32.. are spread).
        let per_shard: Vec<usize> = map.each().map(|shard| shard.len()).collect();
        assert_eq!(per_shard.iter().sum::<usize>(), keys.len());
        assert!(per_shard.iter().all(|&n| n > 100), "{per_shard:?}");
    }

    #[test]
    fn two_maps_hash_with_their_own_keys() {
        let first: Sharded<()> = Sharded::new(1, || ());
        let second: Sharded<()> = Sharded::new(1, || ());
        // Keyed hashers: the same ids hash alike in neither map by chance.
        let differs = (0..8)
            .map(|i| format!("k{i}"))
            .any(|key| first.id("s", &key).hash() != second.id("s", &key).hash());
        assert!(differs);
    }

    #[test]
    fn entries_are_found_and_removed_by_what_their_owner_knows() {
        let map: Sharded<Table<Counter>> = Sharded::new(2, Table::default);
        bump(&map, "s", "k");
        bump(&map, "s", "k");
        let id = map.id("s", "k");
        let mut shard = map.lock(id);
        assert!(shard.find_entry(id.hash(), |c| c.count == 1).is_none());
        let (removed, _) = shard
            .find_entry(id.hash(), |c| c.count == 2)
            .expect("found by its count")
            .remove();
        assert!(removed.id.is(id));
        assert!(shard.get(id).is_none());
        assert!(shard.is_empty());
    }

    #[test]
    fn an_owner_keeps_bytes_after_the_id() {
        let map: Sharded<()> = Sharded::new(1, || ());
        let hashed = map.id("scope", "key");
        let mut id = Id::new(hashed);
        assert!(id.tail().is_empty());
        id.replace_tail([id.id_bytes(), b"request"].concat().into());
        assert_eq!(id.tail(), b"request");
        assert!(id.is(hashed), "the tail is no part of the id");
        assert!(!id.is(map.id("scope", "keyrequest")));
    }

    #[test]
    #[should_panic(expected = "the id stays in front")]
    fn a_tail_cannot_replace_the_id() {
        let map: Sharded<()> = Sharded::new(1, || ());
        let mut id = Id::new(map.id("scope", "key"));
        id.replace_tail(b"other".as_slice().into());
    }
}
