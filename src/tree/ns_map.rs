//! The namespace map: namespace id -> root, a hash map striped into shards whose readers
//! never lock.
//!
//! `SHARDS` shards, picked by the top bits of the id's hash; each is an open-addressing
//! table (`Table`: linear probing, a power of two slots long, at most half of them used)
//! behind one atomic pointer, and a writer lock. A slot is `(ns, root)`, two atomics
//! written only under the shard's lock; `root` is null (never used: a probe stops there),
//! [`TOMB`] (its namespace was removed: a probe goes on), or a root. A root knows its own
//! namespace (`Root::ns`, immutable), which is what a lookup trusts; the slot's `ns` is a
//! tag that saves reading the roots of other namespaces on the way.
//!
//! - **Lookup** (lock-free, no writes): load the shard's table (Acquire), then probe from
//!   the id's hash: load each slot's `root` (Acquire), stop at null, skip [`TOMB`], and take
//!   a root whose slot tag and own `ns` are the id.
//! - **Add** (under the shard lock): the id's first free slot in its probe sequence (a
//!   tomb, or the null that ends it) gets the tag (Relaxed), then the root (one Release
//!   store, which publishes the root and the tag); O(1) expected.
//! - **Replace a root** (under the shard lock): one Release store of the slot's `root`.
//! - **Remove** (under the shard lock): one Release store of [`TOMB`] into the slot.
//! - **Rebuild** (under the shard lock, when used slots, tombs included, would pass half the
//!   table, or live ones fall under a sixteenth of it): a table sized for the live entries
//!   (a quarter full) is filled off to the side and published with one Release store; the
//!   old one is retired through the epoch. Readers on the old table see the slots as they
//!   were at the copy, a state the map held after they started (see the `namespace` module
//!   for what a dead root means; a root that leaves the map later is retired later, so the
//!   epoch keeps it for them too). Each slot is copied O(1) times amortized, within one
//!   shard, sequentially; a shard's table follows its live entries, so memory comes back
//!   when namespaces go.
//!
//! A slot reused for another namespace is told apart by the root's own `ns`: a reader that
//! read a root from a slot compares it, so it never takes another namespace's root. The tag
//! alone could not: the tag-then-root order makes "new root read implies new tag read", not
//! the converse, so a reader can read a reused slot's *old* root (the tombed namespace's,
//! stored before the tomb) with its *new* tag, and the old root's child table may still
//! show it that namespace's pages (loom: `namespace_map_slot_reuse_racing_a_lookup`, mutant
//! N8 in `docs/loom-mutants.md`).
//!
//! The tag's store order (before the root, which publishes it) is not what keeps lookups
//! right, and swapping it is no mutant (`docs/loom-mutants.md`): with the root's own `ns`
//! compared, a stale tag can only make a reader skip a root (a tag of another namespace
//! where a new root was just stored), never take a wrong one. With the stores swapped
//! (root, then tag), a reader that skips the new root read the slot in the one window
//! between the two stores, and nothing else shows that window to anyone (the stores are
//! adjacent under the shard lock; everything the creator does next, the hang of its first
//! page included, follows the tag store), so its "absent" is the answer of a lookup ordered
//! just before the tag store, where the entry then counts as added: linearizable, just
//! never needed to be. The order kept here makes the root's store that moment, so that a
//! reader that reads a root also reads its tag.
//!
//! So creating the n-th namespace costs O(1) expected, copies no other namespace's entry
//! except in a shard's (amortized) rebuild, allocates nothing but its root, and serializes
//! only with writers of the same shard. Everything comes from `crate::sync`, so the loom
//! models run this map as is (one shard with a small first table, to keep them small).

use crossbeam_utils::CachePadded;

use super::Root;
use crate::sync::epoch::{Atomic, Guard, Owned, Shared, unprotected};
use crate::sync::{AtomicPtr, AtomicU64, Mutex, MutexGuard, Ordering, lock};

/// Shards (a power of two): writers that create or remove namespaces in different shards
/// never wait for each other.
#[cfg(not(loom))]
const SHARD_BITS: u32 = 7;
/// Under loom: one shard, so a model crosses the map's races with as few objects as
/// possible.
#[cfg(loom)]
const SHARD_BITS: u32 = 0;
const SHARDS: usize = 1 << SHARD_BITS;
/// Slots of a shard's first (and smallest) table.
#[cfg(not(loom))]
const FIRST_SLOTS: usize = 16;
#[cfg(loom)]
const FIRST_SLOTS: usize = 4;

/// A removed entry's `root`: probes go on past it (a dangling address, never a root's).
const TOMB: *mut Root = std::ptr::dangling_mut::<Root>();

/// One slot (see the module docs).
struct Slot {
    ns: AtomicU64,
    root: AtomicPtr<Root>,
}

/// A shard's table: the slots. Owns nothing else (roots are retired by whoever removes
/// them, or freed by the tree's Drop).
struct Table {
    slots: Box<[Slot]>,
}

impl Table {
    fn new(n: usize) -> Table {
        debug_assert!(n.is_power_of_two());
        let slots = (0..n)
            .map(|_| Slot { ns: AtomicU64::new(0), root: AtomicPtr::new(std::ptr::null_mut()) });
        Table { slots: slots.collect() }
    }

    /// The slots of `h`'s probe sequence, from its home slot on, once around the table.
    #[inline]
    fn probe(&self, h: u64) -> impl Iterator<Item = &Slot> {
        let mask = self.slots.len() - 1;
        let home = h as usize & mask;
        (0..self.slots.len()).map(move |i| &self.slots[(home + i) & mask])
    }
}

struct Shard {
    table: Atomic<Table>,
    /// Held to add, remove or re-root an entry, and to rebuild the table.
    lock: Mutex<Counts>,
}

/// A shard's counts, under its lock.
#[derive(Default)]
struct Counts {
    /// Slots naming a root.
    live: usize,
    /// Slots naming a root or [`TOMB`].
    used: usize,
}

/// See the module docs.
pub(super) struct NsMap {
    shards: Box<[CachePadded<Shard>]>,
}

/// The hash of an id (splitmix64's finalizer): ids are often sequential, and both the shard
/// (top bits) and the slot (low bits) must spread them.
#[inline]
fn hash(ns: u64) -> u64 {
    let mut z = ns.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A shard held for writing (see [`NsMap::write`]).
pub(super) struct ShardWriter<'a, 'g> {
    shard: &'a Shard,
    counts: MutexGuard<'a, Counts>,
    g: &'g Guard,
    ns: u64,
    h: u64,
}

impl NsMap {
    pub(super) fn new() -> NsMap {
        let shards = (0..SHARDS)
            .map(|_| {
                CachePadded::new(Shard {
                    table: Atomic::new(Table::new(FIRST_SLOTS)),
                    lock: Mutex::new(Counts::default()),
                })
            })
            .collect();
        NsMap { shards }
    }

    #[inline]
    fn shard(&self, h: u64) -> &Shard {
        &self.shards[(h >> (63 - SHARD_BITS) >> 1) as usize]
    }

    /// The root the map names for `ns` now (null if none): lock-free, writes nothing. The
    /// root was in the map at a moment after `g` was pinned (it is retired only after it
    /// leaves the map, so the epoch keeps it for `g`).
    #[inline]
    pub(super) fn get(&self, ns: u64, g: &Guard) -> *mut Root {
        let h = hash(ns);
        // Acquire: pairs with the Release store that published the table (and the slots
        // its builder filled).
        let t = self.shard(h).table.load(Ordering::Acquire, g);
        // SAFETY: a table is retired through the epoch only after being swapped out, so one
        // loaded under `g` is valid for 'g; a shard always has one.
        let t = unsafe { t.deref() };
        for s in t.probe(h) {
            // Acquire: pairs with the Release store of this root (and of its slot's tag).
            let r = s.root.load(Ordering::Acquire);
            if r.is_null() {
                break;
            }
            // Relaxed: the tag was stored before the root read above (its Release orders it).
            // It is only a filter: a slot reused for another namespace can show its old root
            // with its new tag (module docs), so the root's own namespace decides.
            if r != TOMB && s.ns.load(Ordering::Relaxed) == ns {
                // SAFETY: a root read from the map under `g` is valid for 'g (see above).
                if unsafe { (*r).ns } == ns {
                    return r;
                }
            }
        }
        std::ptr::null_mut()
    }

    /// Takes `ns`'s shard lock, for [`ShardWriter::get`] / [`ShardWriter::set`] /
    /// [`ShardWriter::remove_if`].
    pub(super) fn write<'a, 'g>(&'a self, ns: u64, g: &'g Guard) -> ShardWriter<'a, 'g> {
        let h = hash(ns);
        let shard = self.shard(h);
        ShardWriter { shard, counts: lock(&shard.lock), g, ns, h }
    }

    /// The heap bytes of the map itself (its shards and their tables; not the roots): what
    /// it asks the allocator for. Exact at quiescence.
    pub(super) fn heap_bytes(&self, g: &Guard) -> usize {
        let mut bytes = self.shards.len() * std::mem::size_of::<CachePadded<Shard>>();
        for s in self.shards.iter() {
            // Acquire: as in `get`.
            let t = s.table.load(Ordering::Acquire, g);
            // SAFETY: as in `get`.
            let t = unsafe { t.deref() };
            bytes += std::mem::size_of::<Table>() + t.slots.len() * std::mem::size_of::<Slot>();
        }
        bytes
    }

    /// Every root in the map (for quiescent walks: tests and Drop). `f` gets each root
    /// pointer; with writers running it may miss or repeat some.
    pub(super) fn for_each(&self, g: &Guard, f: &mut dyn FnMut(*mut Root)) {
        for s in self.shards.iter() {
            // Acquire (all loads here): as in `get`.
            let t = s.table.load(Ordering::Acquire, g);
            // SAFETY: as in `get`.
            let t = unsafe { t.deref() };
            for s in t.slots.iter() {
                let r = s.root.load(Ordering::Acquire);
                if !r.is_null() && r != TOMB {
                    f(r);
                }
            }
        }
    }
}

impl<'g> ShardWriter<'_, 'g> {
    /// The current table (the lock orders it: only lock holders store it).
    fn table(&self) -> &'g Table {
        // Relaxed: stored only under the shard lock, which we hold.
        let t = self.shard.table.load(Ordering::Relaxed, self.g);
        // SAFETY: the current table, not retired (tables are retired only when swapped out,
        // under this lock).
        unsafe { t.deref() }
    }

    /// The slot naming this id's root in the current table, if any.
    fn find(&self) -> Option<&'g Slot> {
        for s in self.table().probe(self.h) {
            // Relaxed (both loads): slots are stored only under the shard lock, held here.
            let r = s.root.load(Ordering::Relaxed);
            if r.is_null() {
                return None;
            }
            if r != TOMB && s.ns.load(Ordering::Relaxed) == self.ns {
                return Some(s);
            }
        }
        None
    }

    /// The root the map names for this id now (null if none).
    pub(super) fn get(&self) -> *mut Root {
        // Relaxed: stored only under the shard lock, which we hold.
        self.find().map_or(std::ptr::null_mut(), |s| s.root.load(Ordering::Relaxed))
    }

    /// Makes the map name `root` for this id: one Release store, into the slot naming the
    /// id if there is one (the caller retires the root it replaces), else into the first
    /// free slot of its probe sequence (rebuilding the table first if it would be more than
    /// half used).
    pub(super) fn set(&mut self, root: *mut Root) {
        if let Some(s) = self.find() {
            // Release: publishes the new root (built before) to readers that Acquire-load it.
            s.root.store(root, Ordering::Release);
            return;
        }
        let len = self.table().slots.len();
        if 2 * (self.counts.used + 1) > len {
            self.rebuild();
        }
        let slot = self
            .table()
            .probe(self.h)
            // Relaxed: slots are stored only under the shard lock, held here.
            .find(|s| matches!(s.root.load(Ordering::Relaxed), r if r.is_null() || r == TOMB))
            .expect("a table is at most half used");
        // Relaxed: read only after the Release store of the root below, which publishes it
        // (so a reader that reads this root reads this tag; the order is a nicety, not a
        // correctness need: lookups compare the root's own `ns`, see the module docs).
        slot.ns.store(self.ns, Ordering::Relaxed);
        // Relaxed: as above; whether this was a tomb decides the count.
        if slot.root.load(Ordering::Relaxed).is_null() {
            self.counts.used += 1;
        }
        // Release: publishes the root and the slot's tag to readers that Acquire-load it.
        slot.root.store(root, Ordering::Release);
        self.counts.live += 1;
    }

    /// Removes this id's entry if it names `root`; true if it did (the root is the caller's
    /// to retire). May shrink the table after.
    pub(super) fn remove_if(&mut self, root: *mut Root) -> bool {
        let Some(s) = self.find() else { return false };
        // Relaxed: stored only under the shard lock, which we hold.
        if s.root.load(Ordering::Relaxed) != root {
            return false;
        }
        // Release: a reader that reads the tomb goes on probing; nothing else to publish,
        // but Release keeps every store to this slot in one publish order.
        s.root.store(TOMB, Ordering::Release);
        self.counts.live -= 1;
        if self.table().slots.len() > FIRST_SLOTS
            && self.counts.live * 16 < self.table().slots.len()
        {
            self.rebuild();
        }
        true
    }

    /// Replaces the table by one sized for the live entries (a quarter full, at least
    /// [`FIRST_SLOTS`]) holding them and no tombs (see the module docs), and retires the old
    /// one.
    fn rebuild(&mut self) {
        let g = self.g;
        let old = self.table();
        let live = self.counts.live + 1; // room for the entry about to be added
        let new = Table::new((4 * live).next_power_of_two().max(FIRST_SLOTS));
        for s in old.slots.iter() {
            // Relaxed (the loads and stores here): the old slots change only under the lock,
            // held here; the new table is not shared yet (published by the store below).
            let r = s.root.load(Ordering::Relaxed);
            if r.is_null() || r == TOMB {
                continue;
            }
            let ns = s.ns.load(Ordering::Relaxed);
            let to = new
                .probe(hash(ns))
                .find(|x| x.root.load(Ordering::Relaxed).is_null())
                .expect("a new table is at most a quarter full");
            to.ns.store(ns, Ordering::Relaxed);
            to.root.store(r, Ordering::Relaxed);
        }
        // Release: publishes the new table and its slots to readers that Acquire-load it.
        // (Swap: the old pointer is the one we hold under the lock.)
        let old = self.shard.table.swap(Owned::new(new), Ordering::Release, g);
        self.counts.used = self.counts.live;
        // SAFETY: swapped out under the lock, so no thread pinned from now on can load it;
        // the epoch frees it after every guard that could still be reading it is gone.
        unsafe { g.defer_destroy(old) };
    }
}

impl Drop for NsMap {
    fn drop(&mut self) {
        for s in self.shards.iter() {
            // SAFETY: exclusive access (`&mut self`): nothing else can reach the tables.
            let g = unsafe { unprotected() };
            // Relaxed: exclusive access.
            let t = s.table.swap(Shared::null(), Ordering::Relaxed, g);
            if !t.is_null() {
                // SAFETY: exclusive access: nothing else can reach it.
                drop(unsafe { t.into_owned() });
            }
        }
    }
}
