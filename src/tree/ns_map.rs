//! The namespace map: namespace id -> root, a hash map striped into shards whose readers
//! never lock.
//!
//! `SHARDS` shards, picked by the top bits of the id's hash; each is a table of bucket
//! chains (`Buckets`, a power of two long) behind one atomic pointer, and a writer lock.
//! An entry is `(ns, root, next)`: `ns` never changes, `root` and `next` are atomics
//! written only under the shard's lock.
//!
//! - **Lookup** (lock-free, no writes): load the shard's table, then the bucket's head, and
//!   follow `next` to the entry with the id; load its `root`. Every load is Acquire, paired
//!   with the Release store that published what it names.
//! - **Add** (under the shard lock): a new entry, fully built, is published at the head of
//!   its bucket with one Release store; O(1) expected.
//! - **Replace a root** (under the shard lock): one Release store of the entry's `root`.
//! - **Remove** (under the shard lock): one Release store of the predecessor's `next` (or
//!   the bucket head) to the entry's `next`, then the entry is retired through the epoch.
//!   A reader standing on it still reads a valid `next` (entries never change `next` once
//!   unlinked, and the successor is retired only after a later unlink, which the epoch
//!   orders after this reader's guard).
//! - **Grow / shrink** (under the shard lock, when a shard holds 2 entries per bucket, or
//!   fewer than one per 8 buckets): a table twice as long (a quarter as long) with *copies*
//!   of the entries is built off to the side and published with one Release store; the old table and the entries still linked in it are
//!   retired together through the epoch (a table owns the entries linked in it). Readers
//!   on the old table see the entries as they were at the copy, which is a state the map
//!   held after they started (see the `namespace` module for what a dead root means). A
//!   rebuild copies each entry O(1) times amortized, and only within one shard; a shard's
//!   table follows its live entries, so memory comes back when namespaces go.
//!
//! So creating the n-th namespace costs O(1) expected, copies no other namespace's entry
//! except in a shard's (amortized) growth, and serializes only with writers of the same
//! shard. Everything comes from `crate::sync`, so the loom models run this map as is (with
//! fewer shards and buckets, to keep the models small).

use crossbeam_utils::CachePadded;

use super::Root;
use crate::sync::epoch::{Atomic, Guard, Owned, Shared, unprotected};
use crate::sync::{AtomicPtr, Mutex, MutexGuard, Ordering, lock};

/// Shards (a power of two): writers that create or remove namespaces in different shards
/// never wait for each other.
#[cfg(not(loom))]
const SHARD_BITS: u32 = 7;
/// Under loom: one shard and one bucket to start with, so a model crosses the map's races
/// with as few objects as possible.
#[cfg(loom)]
const SHARD_BITS: u32 = 0;
const SHARDS: usize = 1 << SHARD_BITS;
/// Buckets of a shard's first table.
#[cfg(not(loom))]
const FIRST_BUCKETS: usize = 8;
#[cfg(loom)]
const FIRST_BUCKETS: usize = 1;

/// One namespace: its id, its current root, the next entry of its bucket.
struct Entry {
    ns: u64,
    /// The namespace's root (a [`Root`] allocation). Replaced, under the shard lock, only
    /// once the root it names is dead (see `RadixTree::root_or_create`).
    root: AtomicPtr<Root>,
    next: Atomic<Entry>,
}

/// A shard's table: the bucket heads. Owns the entries linked in its chains (its Drop frees
/// them, roots excluded: a root is freed by whoever retires it, or by the tree's Drop).
struct Buckets {
    heads: Box<[Atomic<Entry>]>,
}

impl Buckets {
    fn new(n: usize) -> Buckets {
        Buckets { heads: (0..n).map(|_| Atomic::null()).collect() }
    }

    #[inline]
    fn head(&self, h: u64) -> &Atomic<Entry> {
        &self.heads[h as usize & (self.heads.len() - 1)]
    }
}

impl Drop for Buckets {
    fn drop(&mut self) {
        // SAFETY: a table is dropped only when no reader can reach it (retired through the
        // epoch after being swapped out, or the map's Drop); the entries linked in it are
        // its own: a removed entry was unlinked first (and is retired on its own), and a
        // grown table's entries are copies.
        let g = unsafe { unprotected() };
        for h in self.heads.iter() {
            // Relaxed (here and below): exclusive access, ordered by the epoch or by `&mut`.
            let mut e = h.load(Ordering::Relaxed, g);
            while !e.is_null() {
                // SAFETY: as above: each linked entry is owned by this table, freed once.
                let owned = unsafe { e.into_owned() };
                e = owned.next.load(Ordering::Relaxed, g);
            }
        }
    }
}

struct Shard {
    table: Atomic<Buckets>,
    /// Held to add, remove or re-root an entry, and to grow the table.
    lock: Mutex<usize>,
}

/// See the module docs.
pub(super) struct NsMap {
    shards: Box<[CachePadded<Shard>]>,
}

/// The hash of an id (splitmix64's finalizer): ids are often sequential, and both the shard
/// (top bits) and the bucket (low bits) must spread them.
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
    count: MutexGuard<'a, usize>,
    g: &'g Guard,
    ns: u64,
    h: u64,
}

impl NsMap {
    pub(super) fn new() -> NsMap {
        let shards = (0..SHARDS)
            .map(|_| {
                CachePadded::new(Shard {
                    table: Atomic::new(Buckets::new(FIRST_BUCKETS)),
                    lock: Mutex::new(0),
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
    /// pointer was in the map at a moment after `g` was pinned (it is retired only after
    /// it leaves the map, so the epoch keeps it for `g`).
    #[inline]
    pub(super) fn get(&self, ns: u64, g: &Guard) -> *mut Root {
        let h = hash(ns);
        // Acquire: pairs with the Release store that published the table (its heads and the
        // entries the copy linked in it).
        let t = self.shard(h).table.load(Ordering::Acquire, g);
        // SAFETY: a table is retired through the epoch only after being swapped out, so one
        // loaded under `g` is valid for 'g; a shard always has one.
        let t = unsafe { t.deref() };
        find(t.head(h), ns, g).map_or(std::ptr::null_mut(), |e| {
            // Acquire: pairs with the Release store that published this root.
            e.root.load(Ordering::Acquire)
        })
    }

    /// Takes `ns`'s shard lock, for [`ShardWriter::get`] / [`ShardWriter::set`] /
    /// [`ShardWriter::remove_if`].
    pub(super) fn write<'a, 'g>(&'a self, ns: u64, g: &'g Guard) -> ShardWriter<'a, 'g> {
        let h = hash(ns);
        let shard = self.shard(h);
        ShardWriter { shard, count: lock(&shard.lock), g, ns, h }
    }

    /// Every root in the map (for quiescent walks: tests, stats and Drop). `f` gets each
    /// root pointer; with writers running it may miss or repeat some.
    pub(super) fn for_each(&self, g: &Guard, f: &mut dyn FnMut(*mut Root)) {
        for s in self.shards.iter() {
            // Acquire (all loads here): as in `get`.
            let t = s.table.load(Ordering::Acquire, g);
            // SAFETY: as in `get`.
            let t = unsafe { t.deref() };
            for h in t.heads.iter() {
                let mut e = h.load(Ordering::Acquire, g);
                // SAFETY: entries reachable from a table loaded under `g` are retired only
                // after being unlinked, so they are valid for `g`.
                while let Some(x) = unsafe { e.as_ref() } {
                    f(x.root.load(Ordering::Acquire));
                    e = x.next.load(Ordering::Acquire, g);
                }
            }
        }
    }
}

/// The entry for `ns` in the chain starting at `head`.
#[inline]
fn find<'g>(head: &Atomic<Entry>, ns: u64, g: &'g Guard) -> Option<&'g Entry> {
    // Acquire (both loads): pairs with the Release store that linked the entry, so its
    // fields are seen as built.
    let mut e = head.load(Ordering::Acquire, g);
    // SAFETY: an entry is retired only after it is unlinked (or with the table that links
    // it, after that table is swapped out), so one reached under `g` stays valid for 'g.
    while let Some(x) = unsafe { e.as_ref() } {
        if x.ns == ns {
            return Some(x);
        }
        e = x.next.load(Ordering::Acquire, g);
    }
    None
}

impl<'g> ShardWriter<'_, 'g> {
    /// The current table (the lock orders it: only lock holders store it).
    fn table(&self) -> &'g Buckets {
        // Relaxed: stored only under the shard lock, which we hold.
        let t = self.shard.table.load(Ordering::Relaxed, self.g);
        // SAFETY: the current table, not retired (tables are retired only when swapped out,
        // under this lock).
        unsafe { t.deref() }
    }

    /// The root the map names for this id now (null if none).
    pub(super) fn get(&self) -> *mut Root {
        find(self.table().head(self.h), self.ns, self.g).map_or(std::ptr::null_mut(), |e| {
            // Relaxed: stored only under the shard lock, which we hold.
            e.root.load(Ordering::Relaxed)
        })
    }

    /// Makes the map name `root` for this id: one Release store, of the entry's root if the
    /// id has an entry, else of its bucket's head (a new entry at the front). The caller
    /// retires the root it replaces, if any. May grow the shard's table first.
    pub(super) fn set(&mut self, root: *mut Root) {
        if let Some(e) = find(self.table().head(self.h), self.ns, self.g) {
            // Release: publishes the new root (built before) to readers that Acquire-load it.
            e.root.store(root, Ordering::Release);
            return;
        }
        let len = self.table().heads.len();
        if *self.count >= 2 * len {
            self.rebuild(len * 2);
        }
        let head = self.table().head(self.h);
        // Relaxed: the head changes only under the shard lock, which we hold.
        let next = head.load(Ordering::Relaxed, self.g);
        let e = Owned::new(Entry { ns: self.ns, root: AtomicPtr::new(root), next: Atomic::null() });
        // Relaxed: the entry is published by the Release store of the head below.
        e.next.store(next, Ordering::Relaxed);
        // Release: publishes the entry (and the root it names) to readers that Acquire-load
        // the head.
        head.store(e, Ordering::Release);
        *self.count += 1;
    }

    /// Removes this id's entry if it names `root`; true if it did. The entry is retired
    /// through the epoch after its unlink (the root is the caller's to retire).
    pub(super) fn remove_if(&mut self, root: *mut Root) -> bool {
        let g = self.g;
        let mut link = self.table().head(self.h);
        loop {
            // Relaxed (the loads here): links change only under the shard lock, held here.
            let e = link.load(Ordering::Relaxed, g);
            // SAFETY: a linked entry of the current table, not retired (under the lock).
            let Some(x) = (unsafe { e.as_ref() }) else { return false };
            if x.ns == self.ns {
                if x.root.load(Ordering::Relaxed) != root {
                    return false;
                }
                // Release: readers that Acquire-load the link see the successor as built.
                link.store(x.next.load(Ordering::Relaxed, g), Ordering::Release);
                // SAFETY: unlinked under the lock, so no thread pinned from now on can reach
                // it; a reader standing on it reads its `next`, which stays valid (see the
                // module docs), and the epoch frees it after every such reader is gone.
                unsafe { g.defer_destroy(e) };
                *self.count -= 1;
                let len = self.table().heads.len();
                if len > FIRST_BUCKETS && *self.count * 8 < len {
                    self.rebuild((len / 4).max(FIRST_BUCKETS));
                }
                return true;
            }
            link = &x.next;
        }
    }

    /// Replaces the table by one of `len` buckets holding copies of the entries (grown, or
    /// shrunk once most namespaces are gone: see the module docs), and retires the old one
    /// with its entries.
    fn rebuild(&mut self, len: usize) {
        let g = self.g;
        let old = self.table();
        let new = Buckets::new(len);
        for h in old.heads.iter() {
            // Relaxed (the loads and stores here): the old chains change only under the lock,
            // held here; the new table is not shared yet (published by the store below).
            let mut e = h.load(Ordering::Relaxed, g);
            // SAFETY: linked entries of the current table, not retired (under the lock).
            while let Some(x) = unsafe { e.as_ref() } {
                let head = new.head(hash(x.ns));
                let copy = Owned::new(Entry {
                    ns: x.ns,
                    root: AtomicPtr::new(x.root.load(Ordering::Relaxed)),
                    next: Atomic::null(),
                });
                copy.next.store(head.load(Ordering::Relaxed, g), Ordering::Relaxed);
                head.store(copy, Ordering::Relaxed);
                e = x.next.load(Ordering::Relaxed, g);
            }
        }
        // Release: publishes the new table and its entries to readers that Acquire-load it.
        // (Swap: Relaxed would do for reading the old pointer, which we hold under the lock.)
        let old = self.shard.table.swap(Owned::new(new), Ordering::Release, g);
        // SAFETY: swapped out under the lock, so no thread pinned from now on can load it;
        // its Drop frees the entries linked in it (copies live on in the new table), after
        // every guard that could still be reading them is gone.
        unsafe { g.defer_destroy(old) };
    }
}

impl Drop for NsMap {
    fn drop(&mut self) {
        for s in self.shards.iter() {
            // SAFETY: exclusive access (`&mut self`); the tables free their entries.
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
