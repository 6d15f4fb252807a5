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
//! page being copied or pinned, nor a page the device still holds. The evictable entries
//! sit in `order`, keyed by the host policy (smallest first), and nothing else does.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use crate::tree::EvictionPolicy;

/// A page's identity: `(namespace, page hash)`.
pub(crate) type PageKey = (u64, u64);

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

/// No device page (an entry that is host-only).
pub(crate) const NO_PAGE: u32 = u32::MAX;

/// Eviction order key of a host entry (smaller goes first).
type OrderKey = (u64, u64);

/// One page's host copy.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// First host slot of its page (`P` consecutive host slots).
    pub(crate) base: u32,
    /// The parent page's hash (same namespace); `None` for a namespace's first page.
    pub(crate) parent: Option<u64>,
    /// Load-backs copying it to the device right now.
    pub(crate) pins: u32,
    /// The device page holding the same tokens, or [`NO_PAGE`].
    pub(crate) resident: u32,
    /// The copy is complete (false: a backup is writing it).
    pub(crate) ready: bool,
    /// Last access (a host hit, a backup, a load-back, the device letting it go).
    pub(crate) stamp: u64,
    /// When it became ready.
    pub(crate) created: u64,
    /// Host hits and load-backs (`lfu`, `slru`).
    pub(crate) hits: u32,
    /// Priority of the insert it was backed up from (`priority`).
    pub(crate) priority: i32,
    /// Its key in `order`, when queued.
    queued: Option<OrderKey>,
    /// Entries (writing or ready) naming this page as their parent.
    kids: u32,
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
    slru_threshold: u32,
    /// Host pages not holding any entry (first slots).
    free: Vec<u32>,
    map: Map<Entry>,
    /// How many entries name each absent page as their parent (a present page keeps its
    /// count in [`Entry::kids`]; the count moves here when it goes, and back when it comes).
    orphans: Map<u32>,
    /// The evictable entries, by policy key.
    order: BTreeSet<(OrderKey, PageKey)>,
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
        let free = (0..capacity_pages).rev().map(|p| (p * page_size) as u32).collect();
        HostIndex {
            page_size,
            capacity_pages,
            policy,
            slru_threshold,
            free,
            map: Map::default(),
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

    /// The entry of `key`, if any.
    pub(crate) fn get(&self, key: &PageKey) -> Option<&Entry> {
        self.map.get(key)
    }

    /// Pinned, resident and evictable entries (for stats).
    pub(crate) fn counts(&self) -> (usize, usize, usize) {
        let pinned = self.map.values().filter(|e| e.pins > 0).count();
        let resident = self.map.values().filter(|e| e.resident != NO_PAGE).count();
        (pinned, resident, self.order.len())
    }

    fn order_key(&self, e: &Entry) -> OrderKey {
        match self.policy {
            EvictionPolicy::Lru => (e.stamp, 0),
            EvictionPolicy::Mru => (u64::MAX - e.stamp, 0),
            EvictionPolicy::Fifo => (e.created, 0),
            EvictionPolicy::Filo => (u64::MAX - e.created, 0),
            EvictionPolicy::Lfu => (e.hits as u64, e.stamp),
            EvictionPolicy::Priority => ((e.priority as i64 - i32::MIN as i64) as u64, e.stamp),
            EvictionPolicy::Slru => ((e.hits >= self.slru_threshold) as u64, e.stamp),
        }
    }

    fn evictable(&self, e: &Entry) -> bool {
        e.ready && e.pins == 0 && e.resident == NO_PAGE && e.kids == 0
    }

    /// Puts `key`'s entry in `order` exactly when it is evictable, under its current key.
    fn requeue(&mut self, key: PageKey) {
        let Some(e) = self.map.get(&key) else { return };
        let want = self.evictable(e).then(|| self.order_key(e));
        let had = e.queued;
        if had == want {
            return;
        }
        if let Some(k) = had {
            self.order.remove(&(k, key));
        }
        if let Some(k) = want {
            self.order.insert((k, key));
        }
        self.map.get_mut(&key).expect("present").queued = want;
    }

    fn add_kid(&mut self, ns: u64, parent: Option<u64>) {
        let Some(p) = parent else { return };
        match self.map.get_mut(&(ns, p)) {
            Some(e) => {
                e.kids += 1;
                if e.kids == 1 && e.queued.is_some() {
                    self.requeue((ns, p)); // a leaf no more
                }
            }
            None => *self.orphans.entry((ns, p)).or_insert(0) += 1,
        }
    }

    fn drop_kid(&mut self, ns: u64, parent: Option<u64>) {
        let Some(p) = parent else { return };
        match self.map.get_mut(&(ns, p)) {
            Some(e) => {
                e.kids -= 1;
                if e.kids == 0 {
                    self.requeue((ns, p)); // a leaf again
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

    /// Removes `key`'s entry and frees its host page.
    fn remove(&mut self, key: PageKey) -> Entry {
        let e = self.map.remove(&key).expect("present");
        if let Some(k) = e.queued {
            self.order.remove(&(k, key));
        }
        if e.kids > 0 {
            self.orphans.insert(key, e.kids); // an aborted backup's page with children
        }
        self.free.push(e.base);
        self.drop_kid(key.0, e.parent);
        e
    }

    /// Evicts the first evictable entry in policy order; `false` if none.
    fn evict_one(&mut self, out: &mut Removed) -> bool {
        let Some(&(_, key)) = self.order.iter().next() else { return false };
        self.remove(key);
        out.pages.push(key);
        true
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

    /// Reserves a host page for a backup of `key` (a **writing** entry); `None` if `key`
    /// has an entry already, or no host page is free or evictable (the backup skips it).
    /// Evicts host-only leaves for room.
    pub(crate) fn reserve(
        &mut self,
        key: PageKey,
        parent: Option<u64>,
        priority: i32,
        out: &mut Removed,
    ) -> Option<u32> {
        if self.map.contains_key(&key) {
            return None;
        }
        if self.free.is_empty() {
            self.make_room(1, out);
        }
        let base = self.free.pop()?;
        let t = self.tick();
        let e = Entry {
            base,
            parent,
            pins: 0,
            resident: NO_PAGE,
            ready: false,
            stamp: t,
            created: t,
            hits: 0,
            priority,
            queued: None,
            kids: self.orphans.remove(&key).unwrap_or(0),
        };
        self.map.insert(key, e);
        self.add_kid(key.0, parent);
        Some(base)
    }

    /// A writing entry's copy completed: it is ready, resident on `resident` (a backup's
    /// pinned page), or, given [`NO_PAGE`] (a write-back), on whatever device page an insert
    /// recorded meanwhile ([`HostIndex::mark_resident`]), if any.
    pub(crate) fn commit(&mut self, key: PageKey, resident: u32) {
        let t = self.tick();
        let e = self.map.get_mut(&key).expect("a reserved entry stays until committed or aborted");
        debug_assert!(!e.ready, "committed twice");
        e.ready = true;
        if resident != NO_PAGE {
            e.resident = resident;
        }
        e.stamp = t;
        e.created = t;
        self.requeue(key);
    }

    /// A writing entry's copy failed: it goes, and its host page is free again. Returns the
    /// device page it named as resident ([`HostIndex::mark_resident`]: an insert that
    /// cached the same page meanwhile), or [`NO_PAGE`]: that page has no host copy now.
    pub(crate) fn abort(&mut self, key: PageKey) -> u32 {
        let e = self.map.get(&key).expect("a reserved entry stays until committed or aborted");
        debug_assert!(!e.ready, "aborting a ready entry");
        self.remove(key).resident
    }

    /// The consecutive ready entries for `hashes` (namespace `ns`), from the first on, at
    /// most `max` of them: their host pages. Each is touched (a hit) and, with `pin`,
    /// pinned (a load-back copying it).
    pub(crate) fn run(&mut self, ns: u64, hashes: &[u64], max: usize, pin: bool) -> Vec<u32> {
        let mut out = Vec::new();
        for &h in hashes.iter().take(max) {
            let key = (ns, h);
            let t = self.tick();
            match self.map.get_mut(&key) {
                Some(e) if e.ready => {
                    e.stamp = t;
                    e.hits = e.hits.saturating_add(1);
                    if pin {
                        e.pins += 1;
                    }
                    out.push(e.base);
                }
                _ => break,
            }
            self.requeue(key);
        }
        out
    }

    /// How many consecutive ready entries `hashes` has from the first on (no touch).
    pub(crate) fn peek_run(&self, ns: u64, hashes: &[u64]) -> usize {
        hashes.iter().take_while(|&&h| self.map.get(&(ns, h)).is_some_and(|e| e.ready)).count()
    }

    /// Unpins the entries a load-back pinned, recording the device pages now holding them
    /// (`resident[i]`, or [`NO_PAGE`] when the load-back failed).
    pub(crate) fn unpin(&mut self, ns: u64, hashes: &[u64], resident: &[u32]) {
        for (i, &h) in hashes.iter().enumerate() {
            let key = (ns, h);
            let e = self.map.get_mut(&key).expect("a pinned entry stays");
            debug_assert!(e.pins > 0);
            e.pins -= 1;
            if let Some(&d) = resident.get(i)
                && d != NO_PAGE
            {
                e.resident = d;
            }
            self.requeue(key);
        }
    }

    /// Records that device page `page` holds `key`'s tokens (the device has them again, so
    /// the host copy is kept). Also for a writing entry: a write-back of the page's earlier
    /// device copy may still be copying while an insert caches the page again, and its
    /// commit must not leave the copy host-only (evictable) while the device holds the page.
    /// `false` if there is no entry.
    pub(crate) fn mark_resident(&mut self, key: PageKey, page: u32) -> bool {
        match self.map.get_mut(&key) {
            Some(e) => {
                e.resident = page;
                self.requeue(key);
                true
            }
            _ => false,
        }
    }

    /// Device page `page`, holding `key`, was evicted: its host copy (if the entry names
    /// that page) becomes host-only. Returns whether `key` has an entry (writing or ready).
    pub(crate) fn device_evicted(&mut self, key: PageKey, page: u32) -> bool {
        let t = self.tick();
        match self.map.get_mut(&key) {
            Some(e) => {
                if e.resident == page {
                    e.resident = NO_PAGE;
                    e.stamp = t;
                }
                self.requeue(key);
                true
            }
            None => false,
        }
    }

    /// Checks the index's invariants: every host page is free or held by exactly one
    /// entry (`free + backed == capacity`), the kid counts are the entries' parents, and
    /// `order` holds exactly the evictable entries under their current keys.
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        if self.free.len() + self.map.len() != self.capacity_pages {
            return Err(format!(
                "host pool: free {} + backed {} != {} pages",
                self.free.len(),
                self.map.len(),
                self.capacity_pages
            ));
        }
        let mut bases: Vec<u32> =
            self.free.iter().copied().chain(self.map.values().map(|e| e.base)).collect();
        bases.sort_unstable();
        for (i, b) in bases.iter().enumerate() {
            if *b as usize != i * self.page_size {
                return Err(format!("host page {b} has two owners or is lost"));
            }
        }
        let mut kids: HashMap<PageKey, u32> = HashMap::new();
        for (k, e) in &self.map {
            if let Some(p) = e.parent {
                *kids.entry((k.0, p)).or_insert(0) += 1;
            }
        }
        let counted = |k: &PageKey| match self.map.get(k) {
            Some(e) => (e.kids > 0).then_some(e.kids),
            None => self.orphans.get(k).copied(),
        };
        let present_kids = self.map.values().filter(|e| e.kids > 0).count();
        if kids.len() != present_kids + self.orphans.len()
            || kids.iter().any(|(k, n)| counted(k) != Some(*n))
            || self.orphans.keys().any(|k| self.map.contains_key(k))
        {
            return Err("host index: child counts differ from the entries' parents".into());
        }
        let mut queued = 0;
        for (k, e) in &self.map {
            let want = self.evictable(e).then(|| self.order_key(e));
            if want != e.queued || want.is_some_and(|o| !self.order.contains(&(o, *k))) {
                return Err(format!(
                    "host index: entry {k:?} queued as {:?}, should be {want:?}",
                    e.queued
                ));
            }
            queued += want.is_some() as usize;
        }
        if queued != self.order.len() {
            return Err("host index: the order holds entries that are gone".into());
        }
        Ok(())
    }

    /// Every entry (for checks).
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&PageKey, &Entry)> {
        self.map.iter()
    }
}
