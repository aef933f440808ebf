//! [`Arena`]: where a shard keeps its records' bytes (ids, headers, bodies), appended to a
//! few large blocks instead of one allocation per record.
//!
//! Records outlive the requests around them. Under glibc's malloc, every small chunk a
//! record keeps in the heap splits the free memory the requests' own short-lived
//! allocations are cut from, and every request then pays for it (see the README's
//! benchmark section); appended to blocks, a record costs no allocation and leaves the
//! heap as the requests found it.
//!
//! Each entry is framed with its record's hash and length, so a block can be walked
//! without the table. A freed entry only lowers its block's count of live bytes: a block
//! whose entries are all freed goes back to the allocator, and a sealed block (no longer
//! appended to) that falls below a quarter live is *sparse*: the shard moves its live
//! entries to the current block ([`Arena::take_sparse`]), so the arena never holds more
//! than four times its live bytes, plus the block being filled.

/// The largest block, and the one the arena settles on once it holds that much; the
/// first blocks are smaller, so that a store with a handful of records stays small.
pub(super) const BLOCK: usize = 64 * 1024;
/// The first block's size.
const FIRST_BLOCK: usize = 4 * 1024;
/// An entry larger than this gets a block of its own, freed with it.
const LARGE: usize = BLOCK / 8;
/// Each entry's frame: its record's hash (8 bytes), then its length (4 bytes).
pub(super) const FRAME: usize = 12;

/// A sparse block taken out of its arena ([`Arena::take_sparse`]).
#[derive(Debug)]
pub(super) struct Sparse {
    index: u32,
    bytes: Vec<u8>,
}

impl Sparse {
    /// Every entry the block held, freed or not: its record's hash, where it was, its
    /// bytes.
    pub(super) fn entries(&self) -> impl Iterator<Item = (u64, Span, &[u8])> {
        let mut at = 0;
        std::iter::from_fn(move || {
            let frame = self.bytes.get(at..at + FRAME)?;
            let (hash, len) = frame.split_at(8);
            let hash = u64::from_le_bytes(hash.try_into().expect("8 bytes"));
            let len = u32::from_le_bytes(len.try_into().expect("4 bytes"));
            let start = at + FRAME;
            at = start + len as usize;
            let span = Span {
                block: self.index,
                start: offset(start),
                len,
            };
            Some((hash, span, &self.bytes[start..at]))
        })
    }
}

/// Where an entry's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Span {
    block: u32,
    /// Where the bytes start (after the frame).
    start: u32,
    len: u32,
}

#[derive(Debug, Default)]
struct Block {
    /// Framed entries; `len()` is how far the block is filled. Empty with no capacity
    /// once the block is freed (its index then waits in `Arena::spare`).
    bytes: Vec<u8>,
    /// Bytes of entries not freed yet, frames included.
    live: usize,
    /// No longer appended to: filled, or holding one large entry.
    sealed: bool,
}

/// One shard's record bytes: see the module docs.
#[derive(Debug, Default)]
pub(super) struct Arena {
    blocks: Vec<Block>,
    /// Indices of freed blocks, reused before the list grows.
    spare: Vec<u32>,
    /// The block being filled, if any.
    current: Option<u32>,
    /// The size of the next block to start.
    next_block: usize,
}

impl Arena {
    /// Appends the entry `parts` (concatenated) of the record hashed `hash`. Returns
    /// where it went, and the block sealed for it if that is sparse already, for
    /// [`take_sparse`](Self::take_sparse).
    pub(super) fn push(&mut self, hash: u64, parts: &[&[u8]]) -> (Span, Option<u32>) {
        let len = parts.iter().map(|part| part.len()).sum();
        self.push_with(hash, None, len, |bytes| {
            for part in parts {
                bytes.extend_from_slice(part);
            }
        })
    }

    /// Appends an entry of `len` bytes for the record hashed `hash`: the first bytes of
    /// the entry at `prefix` (a span and how many of its bytes), then what `write`
    /// appends. Returns as [`push`](Self::push) does.
    pub(super) fn push_with(
        &mut self,
        hash: u64,
        prefix: Option<(Span, usize)>,
        len: usize,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> (Span, Option<u32>) {
        let framed = FRAME + len;
        let mut sparse = None;
        let block = if len > LARGE {
            self.start_block(framed, true)
        } else {
            match self.current {
                Some(current) if self.room(current) >= framed => current,
                full => {
                    if let Some(full) = full {
                        sparse = self.seal(full);
                    }
                    let size = self.next_block.clamp(FIRST_BLOCK, BLOCK);
                    self.next_block = (size * 2).min(BLOCK);
                    let block = self.start_block(size, false);
                    self.current = Some(block);
                    block
                }
            }
        };
        let (bytes, source) = self.target_and_source(block, prefix.map(|(span, _)| span));
        bytes.extend_from_slice(&hash.to_le_bytes());
        bytes.extend_from_slice(&entry_len(len).to_le_bytes());
        let start = bytes.len();
        if let Some((span, keep)) = prefix {
            let from = span.start as usize..span.start as usize + keep;
            match source {
                Some(source) => bytes.extend_from_slice(&source[from]),
                None => bytes.extend_from_within(from),
            }
        }
        write(bytes);
        debug_assert_eq!(bytes.len() - start, len, "the entry's announced length");
        self.blocks[block as usize].live += framed;
        let span = Span {
            block,
            start: offset(start),
            len: entry_len(len),
        };
        (span, sparse)
    }

    /// Block `target`'s bytes to append to, and the bytes of block `source` when that is
    /// another block (`None`: none, or the same block).
    fn target_and_source(
        &mut self,
        target: u32,
        source: Option<Span>,
    ) -> (&mut Vec<u8>, Option<&[u8]>) {
        match source {
            Some(span) if span.block != target => {
                let [to, from] = self
                    .blocks
                    .get_disjoint_mut([target as usize, span.block as usize])
                    .expect("two blocks of the arena");
                (&mut to.bytes, Some(from.bytes.as_slice()))
            }
            _ => (&mut self.blocks[target as usize].bytes, None),
        }
    }

    /// The bytes at `span`.
    pub(super) fn get(&self, span: Span) -> &[u8] {
        let start = span.start as usize;
        &self.blocks[span.block as usize].bytes[start..start + span.len as usize]
    }

    /// Frees the entry at `span`. Returns its block when that has become sparse, for
    /// [`take_sparse`](Self::take_sparse); a block with nothing live left is freed at
    /// once (or, the current one, filled again from its start).
    #[must_use = "a sparse block must be evacuated"]
    pub(super) fn free(&mut self, span: Span) -> Option<u32> {
        let index = span.block;
        let block = &mut self.blocks[index as usize];
        block.live -= FRAME + span.len as usize;
        if block.live == 0 {
            if block.sealed {
                *block = Block::default();
                self.spare.push(index);
            } else {
                block.bytes.clear();
            }
            return None;
        }
        self.is_sparse(index).then_some(index)
    }

    /// Takes the sparse block `index` out of the arena for its live entries to be moved
    /// (pushed again, to the current block); `None` when it is no longer sparse (or
    /// already gone). Its index is reused only after [`evacuated`](Self::evacuated), so
    /// no entry pushed meanwhile can be taken for one of its own.
    pub(super) fn take_sparse(&mut self, index: u32) -> Option<Sparse> {
        if !self.is_sparse(index) {
            return None;
        }
        let bytes = std::mem::take(&mut self.blocks[index as usize].bytes);
        Some(Sparse { index, bytes })
    }

    /// The block `sparse` was taken from is free to reuse.
    pub(super) fn evacuated(&mut self, sparse: Sparse) {
        self.blocks[sparse.index as usize] = Block::default();
        self.spare.push(sparse.index);
    }

    /// How many bytes the arena's blocks hold allocated.
    #[cfg(test)]
    pub(super) fn allocated(&self) -> usize {
        self.blocks.iter().map(|block| block.bytes.capacity()).sum()
    }

    /// How many bytes of live entries, frames included, the arena holds.
    #[cfg(test)]
    pub(super) fn live(&self) -> usize {
        self.blocks.iter().map(|block| block.live).sum()
    }

    /// Room left in block `index`.
    fn room(&self, index: u32) -> usize {
        let bytes = &self.blocks[index as usize].bytes;
        bytes.capacity() - bytes.len()
    }

    /// Seals the current block `index`; returns it if it is sparse already.
    fn seal(&mut self, index: u32) -> Option<u32> {
        self.blocks[index as usize].sealed = true;
        self.current = None;
        self.is_sparse(index).then_some(index)
    }

    /// A sealed block, not freed, under a quarter live. (A large entry's own block is
    /// all live until freed.)
    fn is_sparse(&self, index: u32) -> bool {
        let block = &self.blocks[index as usize];
        block.sealed && block.live > 0 && block.live * 4 < block.bytes.capacity()
    }

    /// A new block of `capacity` bytes (sealed from the start for a large entry).
    fn start_block(&mut self, capacity: usize, sealed: bool) -> u32 {
        let block = Block {
            bytes: Vec::with_capacity(capacity),
            live: 0,
            sealed,
        };
        match self.spare.pop() {
            Some(index) => {
                self.blocks[index as usize] = block;
                index
            }
            None => {
                self.blocks.push(block);
                u32::try_from(self.blocks.len() - 1).expect("fewer than 2^32 blocks")
            }
        }
    }
}

/// An entry's length as framed: stored records are bounded far below 4 GiB (the engine
/// caps stored bodies; a larger one is not kept).
fn entry_len(len: usize) -> u32 {
    u32::try_from(len).expect("a record below 4 GiB")
}

/// An offset within a block (blocks are at most [`BLOCK`], or one entry long).
fn offset(at: usize) -> u32 {
    u32::try_from(at).expect("an offset below 4 GiB")
}
