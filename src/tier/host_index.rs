//! The host tier's index: which pages have a host copy, where it lives, and the order in
//! which host-only copies go.
//!
//! One mutex guards all of it ([`HostIndex`] lives in a `Mutex` in the tier), so every
//! operation here is one atomic step of the protocols in the tier's module docs. Pages are
//! keyed by `(namespace, page hash)`: the chained hash of every token from the namespace's
//! first page to the end of the page (the KV-event hash, so a host copy is published under
//! the hash a router already knows). A page is on the host without its parent being there
//! (as in SGLang, where a node's host copy is its own): a host hit is the run of consecutive
//! host pages right after the device prefix.
//!
//! # States of an entry
//!
//! - **writing**: a backup's copy is in flight; not a hit, not evictable, its host page
//!   taken. Becomes **ready** when the copy completes ([`HostIndex::commit`]) or is removed
//!   when it fails ([`HostIndex::abort`]).
//! - **ready**: holds the page's bytes. *Resident* when the same page is also on the device
//!   (the device page is recorded), *host-only* otherwise.
//! - **pinned** (`pins > 0`): a load-back is copying it to the device.
//!
//! A ready entry is **evictable** exactly when it is host-only, unpinned, and no entry
//! (writing or ready) names it as its parent: host eviction takes host-only leaves, never a
//! page being copied or pinned, nor a page the device still holds.
//!
//! # Layout (what each page costs)
//!
//! An entry lives in a slab indexed by its host page (an [`EntryId`]: the host page's first
//! slot is `id * page_size`), so the free list of host pages is the free list of entries and
//! an entry never moves (the slab reserves the host's capacity up front and is written, free,
//! at construction: `resident.rs`). The map from `(namespace, page hash)` holds only the id: an open-addressing
//! table of one 8-byte word per bucket (a 32-bit tag of the key and the id), the keys read
//! off the slab when a tag matches (`id_map.rs`), sized for the host's capacity up front
//! (resident from construction, as the slab) so it never rehashes; an insert's host
//! step hints the probes of the pages a few ahead ([`HostIndex::prefetch`]), so their
//! cache misses overlap. Callers that know an entry's id (a
//! backup committing the pages it reserved, a load-back unpinning what it pinned, the device
//! eviction hook reading the id the device page recorded with `BACKED`) reach it without
//! hashing; a run of pages tries `prev + 1` before the map.
//!
//! # The eviction order
//!
//! `order` holds `(key, id)` by the host policy's key (smallest first). For the policies
//! whose key never decreases while an entry lives (`lru`, `fifo`, `lfu`, `priority`,
//! `slru`: stamps and hit counts only grow, `created` and the priority are fixed once the
//! entry is ready) the order is **lazy**, as the device tree's `evict_index`: an entry's
//! queued key is a lower bound of its current key, left in place when the entry is touched,
//! pinned, or made resident; a host eviction pops the smallest, re-queues it under its
//! current key if that grew, drops it if it is not evictable now (it is queued again when it
//! becomes evictable), and evicts it otherwise. Every key is unique (each stamp is a fresh
//! tick of the index's clock), so the entry evicted is exactly the one the eager order
//! would evict. `mru` and `filo` (keys that decrease) keep the eager order: an entry is
//! queued exactly when evictable, under its current key. In both, an evictable entry is
//! always queued, at most once.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use super::id_map::IdMap;
use super::resident::resident_vec;
use crate::tree::EvictionPolicy;

/// A page's identity: `(namespace, page hash)`.
pub(crate) type PageKey = (u64, u64);

/// An entry's id: its host page (the page's first host slot is `id * page_size`).
pub(crate) type EntryId = u32;

/// The maps' hasher: keys are hashes already (XXH3 or SHA-256 based), so a multiply-mix of
/// the words is enough, and far cheaper than SipHash on this path (one lookup per page).
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(29) ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type Map<V> = HashMap<PageKey, V, BuildHasherDefault<KeyHasher>>;

/// No device page (an entry that is host-only); also "no entry" where an [`EntryId`] is
/// optional.
pub(crate) const NO_PAGE: u32 = u32::MAX;

/// The most entries the slab reserves up front (beyond it, it grows).
const PRESIZE_MAX: usize = 1 << 24;

/// The most entries the slab and the map fault in at construction (80 + 10.7 bytes each:
/// 4M entries are 380 MiB; a larger host faults the rest in where backups first land).
const PREFAULT_MAX: usize = 1 << 22;

/// Eviction order key of a host entry (smaller goes first).
type OrderKey = (u64, u64);

/// [`Entry::parent`] of a namespace's first page (as the tier's `NO_PARENT`).
const NO_PARENT: u64 = u64::MAX;

/// [`Entry::queued`] of an entry not in `order` (no policy's key: the second word of every
/// key is 0 or a stamp, and stamps stay below `u64::MAX`).
const NOT_QUEUED: OrderKey = (u64::MAX, u64::MAX);

/// One page's host copy: 80 bytes (the slab holds one per host page, so its size is what a
/// `write_through` replay faults in; sentinels rather than `Option`s, one time word).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Its page's identity.
    pub(crate) key: PageKey,
    /// The parent page's hash (same namespace), or [`NO_PARENT`] for a namespace's first
    /// page.
    parent: u64,
    /// The time its policy orders by: when it became ready under `fifo` and `filo`, its last
    /// access (a host hit, a backup, a load-back, the device letting it go) under the
    /// others.
    stamp: u64,
    /// Its key in `order`, when queued (lazy policies: a lower bound of its current key), or
    /// [`NOT_QUEUED`].
    queued: OrderKey,
    /// Load-backs copying it to the device right now.
    pub(crate) pins: u32,
    /// The device page holding the same tokens, or [`NO_PAGE`].
    pub(crate) resident: u32,
    /// Host hits and load-backs (`lfu`, `slru`).
    pub(crate) hits: u32,
    /// Priority of the insert it was backed up from (`priority`).
    pub(crate) priority: i32,
    /// Entries (writing or ready) naming this page as their parent.
    kids: u32,
    /// The parent's entry when this one was reserved (a hint: valid while that entry holds
    /// `(key.0, parent)`), or [`NO_PAGE`].
    parent_id: EntryId,
    /// The copy is complete (false: a backup is writing it).
    pub(crate) ready: bool,
    /// The slab slot holds an entry (false: its host page is free).
    live: bool,
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Entry>() == 80);

impl Entry {
    /// The parent page's hash; `None` for a namespace's first page.
    pub(crate) fn parent(&self) -> Option<u64> {
        (self.parent != NO_PARENT).then_some(self.parent)
    }

    /// Its key in `order`, if queued.
    fn queued(&self) -> Option<OrderKey> {
        (self.queued != NOT_QUEUED).then_some(self.queued)
    }

    fn set_queued(&mut self, k: Option<OrderKey>) {
        self.queued = k.unwrap_or(NOT_QUEUED);
    }

    const FREE: Entry = Entry {
        key: (0, 0),
        parent: NO_PARENT,
        stamp: 0,
        queued: NOT_QUEUED,
        pins: 0,
        resident: NO_PAGE,
        hits: 0,
        priority: 0,
        kids: 0,
        parent_id: NO_PAGE,
        ready: false,
        live: false,
    };
}

/// What [`HostIndex::reserve`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reserved {
    /// A new writing entry.
    New(EntryId),
    /// The page has an entry already (writing or ready): nothing reserved.
    Have(EntryId),
    /// No host page is free or evictable: nothing reserved.
    Full,
}

/// What removing or committing an entry tells the caller to publish.
#[derive(Debug, Default)]
pub(crate) struct Removed {
    /// Pages dropped from the host, by namespace, in the order they went.
    pub(crate) pages: Vec<PageKey>,
}

/// The host index and the host slot pool (a free list of host pages).
#[derive(Debug)]
pub(crate) struct HostIndex {
    page_size: usize,
    capacity_pages: usize,
    policy: EvictionPolicy,
    /// The order is lazy (see the module docs): the policy's keys never decrease.
    lazy: bool,
    /// The policy orders by creation (`fifo`, `filo`): [`Entry::stamp`] is fixed at commit.
    by_creation: bool,
    slru_threshold: u32,
    /// Host pages not holding any entry (ids; popped from the back).
    free: Vec<EntryId>,
    /// The entries by id (free ones not `live`); ids at or past its length are free and
    /// never used yet. Written free up to [`PREFAULT_MAX`] entries at construction.
    slab: Vec<Entry>,
    /// The live entries' ids by key (`id_map.rs`: the keys are read off the slab).
    map: IdMap,
    /// How many entries name each absent page as their parent (a present page keeps its
    /// count in [`Entry::kids`]; the count moves here when it goes, and back when it comes).
    orphans: Map<u32>,
    /// The evictable entries by policy key (lazy policies: also stale keys, see the docs).
    order: BTreeSet<(OrderKey, EntryId)>,
    /// A logical clock for stamps (exact order within the index's own history).
    clock: u64,
}

impl HostIndex {
    /// An empty index over `host_slots` host slots (a multiple of `page_size`).
    pub(crate) fn new(
        host_slots: usize,
        page_size: usize,
        policy: EvictionPolicy,
        slru_threshold: u32,
    ) -> HostIndex {
        let capacity_pages = host_slots / page_size;
        // Popped from the back: the lowest host pages go first (runs for the copies).
        let free = (0..capacity_pages as u32).rev().collect();
        let presize = capacity_pages.min(PRESIZE_MAX);
        // The slab's entries are written (free) now, so a backup's reserve writes memory
        // that is resident already (`resident.rs`).
        let slab = resident_vec(presize, PREFAULT_MAX, Entry::FREE);
        let lazy = !matches!(policy, EvictionPolicy::Mru | EvictionPolicy::Filo);
        HostIndex {
            page_size,
            capacity_pages,
            policy,
            lazy,
            by_creation: matches!(policy, EvictionPolicy::Fifo | EvictionPolicy::Filo),
            slru_threshold,
            free,
            slab,
            map: IdMap::with_capacity(presize, presize <= PREFAULT_MAX),
            orphans: Map::default(),
            order: BTreeSet::new(),
            clock: 0,
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Host pages in the pool.
    pub(crate) fn capacity_pages(&self) -> usize {
        self.capacity_pages
    }

    /// Free host pages.
    pub(crate) fn free_pages(&self) -> usize {
        self.free.len()
    }

    /// Entries (writing or ready).
    pub(crate) fn backed_pages(&self) -> usize {
        self.map.len()
    }

    /// The first host slot of entry `id`'s page.
    pub(crate) fn base(&self, id: EntryId) -> u32 {
        id * self.page_size as u32
    }

    /// The id of `key`'s entry, if any.
    pub(crate) fn find(&self, key: &PageKey) -> Option<EntryId> {
        let slab = &self.slab;
        self.map.get(key, |id| slab[id as usize].key)
    }

    /// The id of `key`'s entry, if any, given the id of the entry of the page before it
    /// (`prev`, or [`NO_PAGE`]): a backup reserves a run of pages on consecutive free host
    /// pages when it can, so `prev + 1` is tried first (checked against `key`) before the
    /// map (whose probe is a cache miss or two per page in a large host).
    pub(crate) fn find_after(&self, prev: EntryId, key: &PageKey) -> Option<EntryId> {
        self.guess_after(prev, key).or_else(|| self.find(key))
    }

    /// `prev + 1` if that entry holds `key` (see [`HostIndex::find_after`]); no map probe.
    pub(crate) fn guess_after(&self, prev: EntryId, key: &PageKey) -> Option<EntryId> {
        let next = prev.wrapping_add(1);
        (prev != NO_PAGE && self.live_with(next, key)).then_some(next)
    }

    /// A prefetch hint: `key` is looked up or reserved soon (see [`IdMap::prefetch`]).
    pub(crate) fn prefetch(&self, key: &PageKey) {
        self.map.prefetch(key);
    }

    /// A prefetch hint for the entry the reserve `k` reserves from now will fill, if the
    /// free list lasts that long (free ids are popped from the top: `k` from the top), so a
    /// run of new pages' entries, scattered over the slab once the host has evicted, are
    /// not a cache miss each in turn (a hint only; it changes nothing).
    pub(crate) fn prefetch_free(&self, k: usize) {
        let Some(i) = self.free.len().checked_sub(k + 1) else { return };
        if let Some(e) = self.slab.get(self.free[i] as usize) {
            crate::tree::prefetch(std::ptr::from_ref(e).cast()); // 80 bytes: two lines at most
        }
    }

    /// The entry of `key`, if any.
    pub(crate) fn get(&self, key: &PageKey) -> Option<&Entry> {
        self.find(key).map(|id| &self.slab[id as usize])
    }

    /// Entry `id` if it is live and holds `key` (an id recorded earlier, checked).
    pub(crate) fn live_with(&self, id: EntryId, key: &PageKey) -> bool {
        self.slab.get(id as usize).is_some_and(|e| e.live && e.key == *key)
    }

    /// Pinned, resident and evictable entries (for stats).
    pub(crate) fn counts(&self) -> (usize, usize, usize) {
        let live = || self.slab.iter().filter(|e| e.live);
        let pinned = live().filter(|e| e.pins > 0).count();
        let resident = live().filter(|e| e.resident != NO_PAGE).count();
        let evictable = live().filter(|e| self.evictable(e)).count();
        (pinned, resident, evictable)
    }

    fn order_key(&self, e: &Entry) -> OrderKey {
        match self.policy {
            EvictionPolicy::Lru => (e.stamp, 0),
            EvictionPolicy::Mru => (u64::MAX - e.stamp, 0),
            EvictionPolicy::Fifo => (e.stamp, 0),
            EvictionPolicy::Filo => (u64::MAX - e.stamp, 0),
            EvictionPolicy::Lfu => (e.hits as u64, e.stamp),
            EvictionPolicy::Priority => ((e.priority as i64 - i32::MIN as i64) as u64, e.stamp),
            EvictionPolicy::Slru => ((e.hits >= self.slru_threshold) as u64, e.stamp),
        }
    }

    fn evictable(&self, e: &Entry) -> bool {
        e.ready && e.pins == 0 && e.resident == NO_PAGE && e.kids == 0
    }

    /// After a change to entry `id`: eager, it is queued exactly when evictable, under its
    /// current key; lazy, an evictable entry not queued is queued under its current key (a
    /// queued one keeps its key, a lower bound, fixed when popped).
    fn requeue(&mut self, id: EntryId) {
        let e = &self.slab[id as usize];
        let ev = self.evictable(e);
        let had = e.queued();
        if self.lazy {
            if !ev || had.is_some() {
                return;
            }
            let k = self.order_key(e);
            self.order.insert((k, id));
            self.slab[id as usize].set_queued(Some(k));
            return;
        }
        let want = ev.then(|| self.order_key(e));
        if had == want {
            return;
        }
        if let Some(k) = had {
            self.order.remove(&(k, id));
        }
        if let Some(k) = want {
            self.order.insert((k, id));
        }
        self.slab[id as usize].set_queued(want);
    }

    /// The entry of `(ns, parent)`: `hint` if it still holds that page, else looked up.
    fn parent_entry(&self, ns: u64, parent: u64, hint: EntryId) -> Option<EntryId> {
        if self.live_with(hint, &(ns, parent)) {
            return Some(hint);
        }
        self.find(&(ns, parent))
    }

    /// Counts a child of `(ns, parent)`; returns the parent's entry, if present.
    fn add_kid(&mut self, ns: u64, parent: Option<u64>, hint: EntryId) -> EntryId {
        let Some(p) = parent else { return NO_PAGE };
        match self.parent_entry(ns, p, hint) {
            Some(pid) => {
                let e = &mut self.slab[pid as usize];
                e.kids += 1;
                if e.kids == 1 && e.queued().is_some() && !self.lazy {
                    self.requeue(pid); // a leaf no more (lazy: dropped when popped)
                }
                pid
            }
            None => {
                *self.orphans.entry((ns, p)).or_insert(0) += 1;
                NO_PAGE
            }
        }
    }

    fn drop_kid(&mut self, ns: u64, parent: Option<u64>, hint: EntryId) {
        let Some(p) = parent else { return };
        match self.parent_entry(ns, p, hint) {
            Some(pid) => {
                let e = &mut self.slab[pid as usize];
                e.kids -= 1;
                if e.kids == 0 {
                    self.requeue(pid); // a leaf again
                }
            }
            None => {
                let k = self.orphans.get_mut(&(ns, p)).expect("a child counted under its parent");
                *k -= 1;
                if *k == 0 {
                    self.orphans.remove(&(ns, p));
                }
            }
        }
    }

    /// Removes entry `id` and frees its host page.
    fn remove(&mut self, id: EntryId) -> Entry {
        let e = std::mem::replace(&mut self.slab[id as usize], Entry::FREE);
        let key = e.key;
        let mapped = self.map.remove(&key, id);
        debug_assert!(mapped, "a live entry is mapped");
        if let Some(k) = e.queued() {
            self.order.remove(&(k, id));
        }
        if e.kids > 0 {
            self.orphans.insert(key, e.kids); // an aborted backup's page with children
        }
        self.free.push(id);
        self.drop_kid(key.0, e.parent(), e.parent_id);
        e
    }

    /// Evicts the first evictable entry in policy order; `false` if none. Lazy: a popped
    /// entry no longer evictable leaves the order, one whose key grew goes back under it.
    fn evict_one(&mut self, out: &mut Removed) -> bool {
        loop {
            let Some((k, id)) = self.order.pop_first() else { return false };
            let e = &self.slab[id as usize];
            debug_assert!(e.live && e.queued() == Some(k));
            if self.lazy {
                if !self.evictable(e) {
                    self.slab[id as usize].set_queued(None);
                    continue;
                }
                let now = self.order_key(e);
                if now != k {
                    debug_assert!(now > k, "a lazy policy's key decreased");
                    self.order.insert((now, id));
                    self.slab[id as usize].set_queued(Some(now));
                    continue;
                }
            }
            self.slab[id as usize].set_queued(None);
            let key = self.remove(id).key;
            out.pages.push(key);
            return true;
        }
    }

    /// Evicts host-only leaves until `pages` pages are free (or nothing is evictable);
    /// returns the pages evicted.
    pub(crate) fn make_room(&mut self, pages: usize, out: &mut Removed) -> usize {
        let mut n = 0;
        while self.free.len() < pages && self.evict_one(out) {
            n += 1;
        }
        n
    }

    /// Evicts at least `pages` host-only leaves (fewer if no more are evictable).
    pub(crate) fn evict(&mut self, pages: usize, out: &mut Removed) -> usize {
        let mut n = 0;
        while n < pages && self.evict_one(out) {
            n += 1;
        }
        n
    }

    /// Reserves a host page for a backup of `key` (a **writing** entry): [`Reserved::New`];
    /// [`Reserved::Have`] if `key` has an entry already, [`Reserved::Full`] if no host page
    /// is free or evictable (the backup skips it). Evicts host-only leaves for room (not
    /// when `key` has an entry). `parent_hint`: the parent's entry id if the caller knows
    /// one (checked), else [`NO_PAGE`].
    pub(crate) fn reserve(
        &mut self,
        key: PageKey,
        parent: Option<u64>,
        parent_hint: EntryId,
        priority: i32,
        out: &mut Removed,
    ) -> Reserved {
        if self.free.is_empty() {
            if let Some(id) = self.find(&key) {
                return Reserved::Have(id);
            }
            self.make_room(1, out);
        }
        // One probe: the map takes the id the page will get, or names `key`'s entry.
        let Some(&id) = self.free.last() else { return Reserved::Full };
        let slab = &self.slab;
        if let Err(have) = self.map.insert(&key, id, |i| slab[i as usize].key) {
            return Reserved::Have(have);
        }
        self.free.pop();
        let t = self.tick();
        let kids = if self.orphans.is_empty() { 0 } else { self.orphans.remove(&key).unwrap_or(0) };
        let parent_id = self.add_kid(key.0, parent, parent_hint);
        let e = Entry {
            key,
            parent: parent.unwrap_or(NO_PARENT),
            stamp: t,
            kids,
            parent_id,
            priority,
            live: true,
            ..Entry::FREE
        };
        // Free ids are popped lowest first, so a fresh one is the slab's length: pushed,
        // not filled with a free entry and then overwritten.
        let i = id as usize;
        if i >= self.slab.len() {
            self.slab.resize(i, Entry::FREE);
            self.slab.push(e);
        } else {
            self.slab[i] = e;
        }
        Reserved::New(id)
    }

    /// A writing entry's copy completed: it is ready, resident on `resident` (a backup's
    /// pinned page), or, given [`NO_PAGE`] (a write-back), on whatever device page an insert
    /// recorded meanwhile ([`HostIndex::mark_resident`]), if any.
    pub(crate) fn commit(&mut self, id: EntryId, resident: u32) {
        let t = self.tick();
        let e = &mut self.slab[id as usize];
        debug_assert!(e.live, "a reserved entry stays until committed or aborted");
        debug_assert!(!e.ready, "committed twice");
        e.ready = true;
        if resident != NO_PAGE {
            e.resident = resident;
        }
        e.stamp = t;
        self.requeue(id);
    }

    /// A writing entry's copy failed: it goes, and its host page is free again. Returns the
    /// device page it named as resident ([`HostIndex::mark_resident`]: an insert that
    /// cached the same page meanwhile), or [`NO_PAGE`]: that page has no host copy now.
    pub(crate) fn abort(&mut self, id: EntryId) -> u32 {
        let e = &self.slab[id as usize];
        debug_assert!(e.live, "a reserved entry stays until committed or aborted");
        debug_assert!(!e.ready, "aborting a ready entry");
        self.remove(id).resident
    }

    /// The ids of the consecutive ready entries for `hashes` (namespace `ns`), from the
    /// first on, at most `max` of them (no touch).
    pub(crate) fn find_run(&self, ns: u64, hashes: &[u64], max: usize) -> Vec<EntryId> {
        let mut out = Vec::new();
        let mut prev = NO_PAGE;
        for &h in hashes.iter().take(max) {
            match self.find_after(prev, &(ns, h)) {
                Some(id) if self.slab[id as usize].ready => out.push(id),
                _ => break,
            }
            prev = *out.last().expect("pushed");
        }
        out
    }

    /// Touches entry `id` (a hit) and, with `pin`, pins it (a load-back copying it).
    fn touch(&mut self, id: EntryId, pin: bool) {
        let t = self.tick();
        let by_creation = self.by_creation;
        let e = &mut self.slab[id as usize];
        if !by_creation {
            e.stamp = t;
        }
        e.hits = e.hits.saturating_add(1);
        if pin {
            e.pins += 1;
        }
        self.requeue(id);
    }

    /// Touches (a hit) and, with `pin`, pins each of `ids` (from [`HostIndex::find_run`]).
    pub(crate) fn touch_run(&mut self, ids: &[EntryId], pin: bool) {
        for &id in ids {
            self.touch(id, pin);
        }
    }

    /// How many consecutive ready entries `hashes` has from the first on; each is touched
    /// (a host hit).
    pub(crate) fn run(&mut self, ns: u64, hashes: &[u64]) -> usize {
        let mut n = 0;
        let mut prev = NO_PAGE;
        for &h in hashes {
            match self.find_after(prev, &(ns, h)) {
                Some(id) if self.slab[id as usize].ready => {
                    self.touch(id, false);
                    prev = id;
                }
                _ => break,
            }
            n += 1;
        }
        n
    }

    /// Unpins the entries a load-back pinned, recording the device pages now holding them
    /// (`resident[i]`, or [`NO_PAGE`] when the load-back failed).
    pub(crate) fn unpin(&mut self, ids: &[EntryId], resident: &[u32]) {
        for (i, &id) in ids.iter().enumerate() {
            let e = &mut self.slab[id as usize];
            debug_assert!(e.live && e.pins > 0, "a pinned entry stays");
            e.pins -= 1;
            if let Some(&d) = resident.get(i)
                && d != NO_PAGE
            {
                e.resident = d;
            }
            self.requeue(id);
        }
    }

    /// Records that device page `page` holds entry `id`'s tokens (the device has them
    /// again, so the host copy is kept). Also for a writing entry: a write-back of the
    /// page's earlier device copy may still be copying while an insert caches the page
    /// again, and its commit must not leave the copy host-only (evictable) while the device
    /// holds the page.
    pub(crate) fn mark_resident(&mut self, id: EntryId, page: u32) {
        self.slab[id as usize].resident = page;
        self.requeue(id);
    }

    /// Device page `page`, holding entry `id`'s tokens, was evicted: the host copy (if the
    /// entry names that page) becomes host-only.
    pub(crate) fn device_evicted(&mut self, id: EntryId, page: u32) {
        let t = self.tick();
        let by_creation = self.by_creation;
        let e = &mut self.slab[id as usize];
        if e.resident == page {
            e.resident = NO_PAGE;
            if !by_creation {
                e.stamp = t;
            }
            self.requeue(id);
        }
    }

    /// Checks the index's invariants: every host page is free or held by exactly one
    /// entry (`free + backed == capacity`, the map naming exactly the live entries), the kid
    /// counts are the entries' parents, and `order` holds every evictable entry once under
    /// its current key (lazy policies: under a key no larger, and maybe entries that are not
    /// evictable now), and only entries whose `queued` names that element.
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        if self.free.len() + self.map.len() != self.capacity_pages {
            return Err(format!(
                "host pool: free {} + backed {} != {} pages",
                self.free.len(),
                self.map.len(),
                self.capacity_pages
            ));
        }
        let live = self.slab.iter().filter(|e| e.live).count();
        let mapped = |id: EntryId| self.slab.get(id as usize).is_some_and(|e| e.live);
        if live != self.map.len()
            || !self.map.ids().all(mapped)
            || self
                .slab
                .iter()
                .enumerate()
                .any(|(id, e)| e.live && self.find(&e.key) != Some(id as EntryId))
        {
            return Err("host index: the map and the live entries differ".into());
        }
        let mut ids: Vec<u32> = self.free.iter().copied().chain(self.map.ids()).collect();
        ids.sort_unstable();
        for (i, &id) in ids.iter().enumerate() {
            if id as usize != i {
                return Err(format!("host page {} has two owners or is lost", self.base(id)));
            }
        }
        let mut kids: HashMap<PageKey, u32> = HashMap::new();
        for e in self.slab.iter().filter(|e| e.live) {
            if let Some(p) = e.parent() {
                *kids.entry((e.key.0, p)).or_insert(0) += 1;
            }
        }
        let counted = |k: &PageKey| match self.get(k) {
            Some(e) => (e.kids > 0).then_some(e.kids),
            None => self.orphans.get(k).copied(),
        };
        let present_kids = self.slab.iter().filter(|e| e.live && e.kids > 0).count();
        if kids.len() != present_kids + self.orphans.len()
            || kids.iter().any(|(k, n)| counted(k) != Some(*n))
            || self.orphans.keys().any(|k| self.find(k).is_some())
        {
            return Err("host index: child counts differ from the entries' parents".into());
        }
        let mut queued = 0;
        for (id, e) in self.slab.iter().enumerate().filter(|(_, e)| e.live) {
            let want = self.evictable(e).then(|| self.order_key(e));
            let ok = match (self.lazy, e.queued(), want) {
                (false, q, w) => q == w,
                (true, Some(q), Some(w)) => q <= w,
                (true, None, Some(_)) => false,
                (true, _, None) => true,
            };
            let listed = e.queued().is_none_or(|q| self.order.contains(&(q, id as EntryId)));
            if !ok || !listed {
                return Err(format!(
                    "host index: entry {:?} queued as {:?}, should be {want:?}",
                    e.key,
                    e.queued()
                ));
            }
            queued += e.queued().is_some() as usize;
        }
        if queued != self.order.len() {
            return Err("host index: the order holds entries that are gone".into());
        }
        Ok(())
    }

    /// Every entry (for checks).
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&PageKey, &Entry)> {
        self.slab.iter().filter(|e| e.live).map(|e| (&e.key, e))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The entry the policy names: the smallest current key among the evictable entries
    /// (what the eager order pops), computed from scratch.
    fn expected_victim(ix: &HostIndex) -> Option<PageKey> {
        ix.entries()
            .filter(|(_, e)| ix.evictable(e))
            .min_by_key(|(_, e)| ix.order_key(e))
            .map(|(k, _)| *k)
    }

    /// Random operations on a small host (chains of pages, touches, pins, resident marks,
    /// device evictions, host evictions) under every policy: each host eviction takes
    /// exactly the entry a from-scratch scan names (so the lazy order is exact), and the
    /// invariants hold after every step.
    #[test]
    fn every_policy_evicts_the_entry_its_key_names() {
        let policies = [
            EvictionPolicy::Lru,
            EvictionPolicy::Mru,
            EvictionPolicy::Fifo,
            EvictionPolicy::Filo,
            EvictionPolicy::Lfu,
            EvictionPolicy::Priority,
            EvictionPolicy::Slru,
        ];
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut evictions = 0;
        for policy in policies {
            for _round in 0..20 {
                let mut ix = HostIndex::new(8 * 2, 2, policy, 2);
                let mut pinned: Vec<Vec<EntryId>> = Vec::new();
                for _ in 0..300 {
                    // Pages 1..=12 in one namespace; page h's parent is h - 1 (none for 1).
                    let h = 1 + rnd(12);
                    let key = (0, h);
                    let parent = (h > 1).then(|| h - 1);
                    match rnd(8) {
                        0 | 1 => {
                            let mut out = Removed::default();
                            let full = ix.free_pages() == 0 && ix.find(&key).is_none();
                            let want = if full { expected_victim(&ix) } else { None };
                            let prio = rnd(3) as i32;
                            if let Reserved::New(id) =
                                ix.reserve(key, parent, NO_PAGE, prio, &mut out)
                            {
                                let resident = if rnd(2) == 0 { NO_PAGE } else { rnd(100) as u32 };
                                ix.commit(id, resident);
                            }
                            assert_eq!(out.pages.first().copied(), want, "{policy:?}");
                            evictions += out.pages.len();
                        }
                        2 => {
                            let hashes: Vec<u64> = (h..=12).collect();
                            ix.run(0, &hashes);
                        }
                        3 => {
                            let ids = ix.find_run(0, &[h, h + 1], 2);
                            ix.touch_run(&ids, true);
                            pinned.push(ids);
                        }
                        4 => {
                            if let Some(ids) = pinned.pop() {
                                let res: Vec<u32> = ids.iter().map(|_| NO_PAGE).collect();
                                ix.unpin(&ids, &res);
                            }
                        }
                        5 => {
                            if let Some(id) = ix.find(&key) {
                                ix.mark_resident(id, 7);
                            }
                        }
                        6 => {
                            if let Some(id) = ix.find(&key) {
                                let r = ix.get(&key).expect("found").resident;
                                ix.device_evicted(id, r);
                            }
                        }
                        _ => {
                            let want = expected_victim(&ix);
                            let mut out = Removed::default();
                            ix.evict(1, &mut out);
                            assert_eq!(out.pages.first().copied(), want, "{policy:?}");
                            evictions += out.pages.len();
                        }
                    }
                    ix.check().unwrap_or_else(|e| panic!("{policy:?}: {e}"));
                }
            }
        }
        assert!(evictions > 1000, "the test evicted too little to say anything: {evictions}");
    }
}
