//! Lock handles of the C ABI: a per-cache, sharded slab of values (the cache's
//! [`PrefixLock`](radixkv_core::tree::PrefixLock)s) addressed by `u64` handles.
//!
//! A handle packs, from the high bits down:
//!
//! | bits  | field      | meaning                                                     |
//! |-------|------------|-------------------------------------------------------------|
//! | 20    | tag        | per-cache tag, never 0 (so no handle is 0)                  |
//! | 5     | shard      | which of the 32 shards holds the entry                      |
//! | 19    | index      | entry in that shard                                         |
//! | 20    | generation | bumped each time the entry is vacated                       |
//!
//! A handle is honoured only when its tag is this cache's, its index names an occupied entry
//! of its shard, and the entry's generation equals the handle's. So an unknown, released or
//! foreign handle is refused (never undefined behavior), with two documented limits:
//!
//! - tags are unique among live tables (a process-wide registry hands out the next tag not
//!   in use), so another live cache's handle is always refused; a freed cache's tag is
//!   reused by later caches, and more than `2^20 - 1` live tables at once is refused;
//! - a vacated entry is reused only after [`QUARANTINE`] other entries of its shard were
//!   vacated after it, so a generation comes back (a stale handle aliasing a new lock) only
//!   after `2^20 * 1024` (about 10^9) releases in that shard.
//!
//! A handle is reserved before the operation that takes the lock ([`LockTable::reserve`]),
//! so an FFI call that could not hand out a handle fails before it changes anything.
//!
//! Each thread inserts into its own shard (assigned round-robin on first use), so threads
//! taking locks at once mostly take different mutexes; a release goes to the shard named by
//! the handle. Capacity: `2^19` live locks per shard, spilling into the other shards, so
//! 16.7 million live locks per cache.

use std::cell::Cell;
use std::collections::VecDeque;
// std atomics and locks (the C ABI is outside the loom models): these process-wide statics need
// `const` constructors, which loom's types do not have.
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, recovering from a poisoned lock (the tables hold plain data, consistent at
/// every unlock).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

const TAG_BITS: u32 = 20;
const SHARD_BITS: u32 = 5;
const INDEX_BITS: u32 = 19;
const GEN_BITS: u32 = 20;
const _: () = assert!(TAG_BITS + SHARD_BITS + INDEX_BITS + GEN_BITS == 64);

const GEN_SHIFT: u32 = 0;
const INDEX_SHIFT: u32 = GEN_SHIFT + GEN_BITS;
const SHARD_SHIFT: u32 = INDEX_SHIFT + INDEX_BITS;
const TAG_SHIFT: u32 = SHARD_SHIFT + SHARD_BITS;

const GEN_MASK: u64 = (1 << GEN_BITS) - 1;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const SHARD_MASK: u64 = (1 << SHARD_BITS) - 1;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;

/// Shards per cache.
pub(crate) const SHARDS: usize = 1 << SHARD_BITS;
/// Live entries one shard can hold.
const MAX_PER_SHARD: usize = 1 << INDEX_BITS;
/// Live entries one table can hold (16.7 million).
pub(crate) const MAX_LOCKS: usize = SHARDS * MAX_PER_SHARD;
/// Vacated entries a shard keeps aside before reusing the oldest of them.
pub(crate) const QUARANTINE: usize = 1024;

/// The tags of live tables (a bit per tag, allocated on first use) and where the search
/// for a free one starts.
static TAGS: std::sync::Mutex<(Vec<u64>, u64)> = std::sync::Mutex::new((Vec::new(), 0));

/// A tag no live table has, or `None` when all `2^20 - 1` are in use.
fn acquire_tag() -> Option<u64> {
    let mut g = TAGS.lock().unwrap_or_else(|e| e.into_inner());
    let (live, next) = &mut *g;
    if live.is_empty() {
        live.resize(((TAG_MASK + 1) / 64) as usize, 0);
    }
    for k in 0..TAG_MASK {
        let tag = (*next + k) % TAG_MASK + 1; // 1..=TAG_MASK: never 0
        let (w, b) = ((tag / 64) as usize, tag % 64);
        if live[w] & (1 << b) == 0 {
            live[w] |= 1 << b;
            *next = tag; // the next search starts after it: tags come back as late as possible
            return Some(tag);
        }
    }
    None
}

fn release_tag(tag: u64) {
    let mut g = TAGS.lock().unwrap_or_else(|e| e.into_inner());
    g.0[(tag / 64) as usize] &= !(1 << (tag % 64));
}
/// Source of per-thread shard hints.
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's home shard; `usize::MAX` until first used.
    static HOME_SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The shard this thread inserts into first.
fn home_shard() -> usize {
    HOME_SHARD.with(|c| {
        let s = c.get();
        if s != usize::MAX {
            return s;
        }
        let s = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
        c.set(s);
        s
    })
}

struct Entry<T> {
    generation: u64,
    lock: Option<T>,
}

struct Shard<T> {
    entries: Vec<Entry<T>>,
    /// Vacated entries, oldest first.
    vacant: VecDeque<u32>,
}

impl<T> Default for Shard<T> {
    fn default() -> Self {
        Shard { entries: Vec::new(), vacant: VecDeque::new() }
    }
}

impl<T> Shard<T> {
    /// An index to fill, or `None` when the shard is full.
    fn take_vacant(&mut self) -> Option<usize> {
        if (self.vacant.len() > QUARANTINE || self.entries.len() >= MAX_PER_SHARD)
            && let Some(i) = self.vacant.pop_front()
        {
            return Some(i as usize);
        }
        if self.entries.len() < MAX_PER_SHARD {
            self.entries.push(Entry { generation: 0, lock: None });
            return Some(self.entries.len() - 1);
        }
        None
    }
}

/// The handles of one cache. Every method takes `&self` and is safe to call from many
/// threads at once.
pub(crate) struct LockTable<T> {
    tag: u64,
    shards: Box<[CachePadded<Mutex<Shard<T>>>]>,
}

impl<T> LockTable<T> {
    /// An empty table with a tag no other live table has; `None` when `2^20 - 1` tables
    /// are live.
    pub(crate) fn new() -> Option<Self> {
        let tag = acquire_tag()?;
        let shards = (0..SHARDS).map(|_| CachePadded::new(Mutex::new(Shard::default()))).collect();
        Some(LockTable { tag, shards })
    }

    fn decode(&self, handle: u64) -> Option<(usize, usize, u64)> {
        if (handle >> TAG_SHIFT) & TAG_MASK != self.tag {
            return None;
        }
        let shard = ((handle >> SHARD_SHIFT) & SHARD_MASK) as usize;
        let index = ((handle >> INDEX_SHIFT) & INDEX_MASK) as usize;
        Some((shard, index, handle & GEN_MASK))
    }

    /// Stores `lock` and returns its handle (never 0); gives the lock back when every
    /// shard is full. (The C ABI reserves first; the tests use this shorthand.)
    #[cfg(test)]
    pub(crate) fn insert(&self, lock_: T) -> Result<u64, T> {
        match self.reserve() {
            Some(r) => Ok(r.fill(lock_)),
            None => Err(lock_),
        }
    }

    /// Sets an entry aside for a lock about to be taken; `None` when every shard is full.
    /// The entry is empty until [`Reserved::fill`] (its handle is refused until then), and
    /// goes back unused if the reservation is dropped unfilled.
    pub(crate) fn reserve(&self) -> Option<Reserved<'_, T>> {
        let home = home_shard();
        for k in 0..SHARDS {
            let s = (home + k) % SHARDS;
            if let Some(i) = lock(&self.shards[s]).take_vacant() {
                return Some(Reserved { table: self, shard: s, index: i, filled: false });
            }
        }
        None
    }

    /// Removes and returns the lock of `handle`; `None` for an unknown, released or
    /// foreign handle. Of two threads removing one handle at once, exactly one gets it.
    pub(crate) fn remove(&self, handle: u64) -> Option<T> {
        let (s, i, generation) = self.decode(handle)?;
        let mut shard = lock(&self.shards[s]);
        let e = shard.entries.get_mut(i)?;
        if e.generation != generation {
            return None;
        }
        let l = e.lock.take()?;
        e.generation = (generation + 1) & GEN_MASK;
        shard.vacant.push_back(i as u32);
        Some(l)
    }

    /// Runs `f` on the lock of `handle`; `None` for an unknown, released or foreign handle.
    pub(crate) fn with<R>(&self, handle: u64, f: impl FnOnce(&T) -> R) -> Option<R> {
        let (s, i, generation) = self.decode(handle)?;
        let shard = lock(&self.shards[s]);
        let e = shard.entries.get(i)?;
        if e.generation != generation {
            return None;
        }
        e.lock.as_ref().map(f)
    }

    /// Why `handle` is refused (for an error message; `handle` is refused when this runs):
    /// it is 0, names another table, names an entry never handed out, or was released.
    pub(crate) fn explain(&self, handle: u64) -> &'static str {
        if handle == 0 {
            return "is not a lock: 0 is never a valid lock";
        }
        let Some((s, i, generation)) = self.decode(handle) else {
            return "is not a lock of this cache (another cache's, one of a cache freed since, \
                    or not a handle at all)";
        };
        let shard = lock(&self.shards[s]);
        match shard.entries.get(i) {
            Some(e) if e.generation != generation || e.lock.is_none() => {
                "was released already (a lock is released exactly once)"
            }
            Some(_) => "is not live",
            None => "was never handed out by this cache",
        }
    }

    /// Takes every live lock out of the table.
    pub(crate) fn drain(&mut self) -> Vec<T> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            let shard = &mut *shard;
            for (i, e) in shard.entries.iter_mut().enumerate() {
                if let Some(l) = e.lock.take() {
                    e.generation = (e.generation + 1) & GEN_MASK;
                    shard.vacant.push_back(i as u32);
                    out.push(l);
                }
            }
        }
        out
    }
}

impl<T> Drop for LockTable<T> {
    fn drop(&mut self) {
        release_tag(self.tag);
    }
}

/// An entry of a [`LockTable`] set aside by [`LockTable::reserve`].
pub(crate) struct Reserved<'a, T> {
    table: &'a LockTable<T>,
    shard: usize,
    index: usize,
    filled: bool,
}

impl<T> Reserved<'_, T> {
    /// Stores `lock` in the reserved entry and returns its handle (never 0).
    pub(crate) fn fill(mut self, lock_: T) -> u64 {
        let t = self.table;
        let mut shard = lock(&t.shards[self.shard]);
        let e = &mut shard.entries[self.index];
        e.lock = Some(lock_);
        self.filled = true;
        (t.tag << TAG_SHIFT)
            | ((self.shard as u64) << SHARD_SHIFT)
            | ((self.index as u64) << INDEX_SHIFT)
            | (e.generation << GEN_SHIFT)
    }
}

impl<T> Drop for Reserved<'_, T> {
    fn drop(&mut self) {
        if !self.filled {
            // Never handed out: its generation is unchanged, and it is reused first.
            lock(&self.table.shards[self.shard]).vacant.push_front(self.index as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stands for a lock pinning `n` tokens.
    fn fake(n: u32) -> Vec<u32> {
        (0..n).collect()
    }

    #[test]
    fn handles_are_nonzero_unique_and_single_use() {
        let t = LockTable::<Vec<u32>>::new().unwrap();
        let a = t.insert(fake(1)).unwrap();
        let b = t.insert(fake(2)).unwrap();
        assert_ne!(a, 0);
        assert_ne!(a, b);
        assert_eq!(t.with(a, |l| l.len()), Some(1));
        assert_eq!(t.with(b, |l| l.len()), Some(2));
        assert_eq!(t.remove(a).map(|l| l.len()), Some(1));
        assert!(t.remove(a).is_none(), "double release");
        assert!(t.with(a, |l| l.len()).is_none());
        assert!(t.remove(0).is_none());
        assert!(t.remove(u64::MAX).is_none());
        assert_eq!(t.remove(b).map(|l| l.len()), Some(2));
    }

    #[test]
    fn foreign_handles_are_refused() {
        let t1 = LockTable::<Vec<u32>>::new().unwrap();
        let t2 = LockTable::<Vec<u32>>::new().unwrap();
        let h = t1.insert(fake(3)).unwrap();
        // Same shard, index and generation, other tag.
        let forged = (h & !(TAG_MASK << TAG_SHIFT)) | (t2.tag << TAG_SHIFT);
        let h2 = t2.insert(fake(4)).unwrap();
        assert!(t2.remove(h).is_none());
        assert!(t1.remove(h2).is_none());
        assert_eq!(t2.remove(forged).map(|l| l.len()), if forged == h2 { Some(4) } else { None });
        assert!(t1.remove(h).is_some());
    }

    #[test]
    fn stale_handles_stay_stale_across_reuse() {
        let t = LockTable::<Vec<u32>>::new().unwrap();
        let first = t.insert(fake(1)).unwrap();
        assert!(t.remove(first).is_some());
        // Cycle more than the quarantine through one thread's shard: the first entry gets
        // reused, with a new generation.
        let mut seen_reuse = false;
        for _ in 0..(QUARANTINE * 3) {
            let h = t.insert(fake(1)).unwrap();
            assert_ne!(h, first);
            if (h >> INDEX_SHIFT) == (first >> INDEX_SHIFT) {
                seen_reuse = true;
            }
            assert!(t.remove(first).is_none());
            assert!(t.remove(h).is_some());
        }
        assert!(seen_reuse, "the vacated entry is reused after the quarantine");
        assert!(t.with(first, |_| ()).is_none());
    }

    #[test]
    fn drain_takes_every_live_lock() {
        let mut t = LockTable::<Vec<u32>>::new().unwrap();
        let hs: Vec<u64> = (0..10).map(|i| t.insert(fake(i)).unwrap()).collect();
        assert!(t.remove(hs[3]).is_some());
        let drained = t.drain();
        assert_eq!(drained.len(), 9);
        for h in hs {
            assert!(t.remove(h).is_none());
        }
    }

    #[test]
    fn many_threads_share_one_table() {
        let t = LockTable::<Vec<u32>>::new().unwrap();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    for i in 0..2000u32 {
                        mine.push(t.insert(fake(i % 5)).unwrap());
                        if i % 3 == 0 {
                            let h = mine.swap_remove(0);
                            assert!(t.remove(h).is_some());
                            assert!(t.remove(h).is_none());
                        }
                    }
                    for h in mine {
                        assert!(t.remove(h).is_some());
                    }
                });
            }
        });
        let mut t = t;
        assert!(t.drain().is_empty());
    }

    #[test]
    fn live_tables_never_share_a_tag() {
        // Found by an audit: tags came from a counter modulo 2^20 - 1, so after a million
        // caches a new one could share a live one's tag and accept its handles.
        let a = LockTable::<Vec<u32>>::new().unwrap();
        let h = a.insert(fake(1)).unwrap();
        for _ in 0..(TAG_MASK + 10) {
            let tag = acquire_tag().unwrap();
            assert_ne!(tag, a.tag);
            release_tag(tag);
        }
        let b = LockTable::<Vec<u32>>::new().unwrap();
        assert_ne!(b.tag, a.tag);
        assert!(b.remove(h).is_none(), "a live table's handle");
        assert!(a.remove(h).is_some());
    }

    #[test]
    fn reservations_fill_or_give_the_entry_back() {
        let t = LockTable::<Vec<u32>>::new().unwrap();
        let r = t.reserve().unwrap();
        let (s, i) = (r.shard, r.index);
        let h = r.fill(fake(2));
        assert_eq!(t.with(h, |l| l.len()), Some(2));
        let r = t.reserve().unwrap();
        let (s2, i2) = (r.shard, r.index);
        assert_ne!((s, i), (s2, i2), "a filled entry is not handed out again");
        // The handle it would have had is refused while empty, and after the drop.
        let would =
            (t.tag << TAG_SHIFT) | ((s2 as u64) << SHARD_SHIFT) | ((i2 as u64) << INDEX_SHIFT);
        assert!(t.with(would, |l| l.len()).is_none());
        drop(r);
        assert!(t.remove(would).is_none());
        assert_eq!(lock(&t.shards[s2]).vacant.front(), Some(&(i2 as u32)), "given back first");
        assert_eq!(t.remove(h).map(|l| l.len()), Some(2));
    }
}
