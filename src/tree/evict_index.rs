//! The eviction index: the evictable leaves, in the policy's key order (see `policy.rs`).
//!
//! A leaf enters when it is created unpinned, when its pin count drops to 0, when its last
//! child is evicted, or when it is the lower half of a split of such a leaf. Every operation
//! is O(log n) in the number of queued leaves; nothing scans the tree and nothing is rebuilt
//! per call. Two structures, by how the policy's keys move:
//!
//! **Keys that only grow** (`lru`, `fifo`, `filo`, `lfu`, `slru`, `priority`: stamps,
//! hit counts and priorities never go down, and `fifo`/`filo` keys never move): a lazy
//! priority queue ([`Queue`]). Entries are never updated in place: an entry's key is a lower
//! bound of its node's current key (it was current when pushed, and keys only grow since:
//! in each atomic's modification order, as a touch raises the stamp with `fetch_max`, so
//! racing touches never take it back below a value a push read; `RadixTree::touch`, and
//! `check_invariants` checks the bound at quiescence).
//! `pop` takes the smallest entry and checks it against the node's current state and key:
//! it drops an entry whose node is no longer a candidate, and re-queues one whose key grew
//! (the same ticket, the new key). An entry popped with its current key is the smallest
//! current key of all: every other node's current key is at least its entry's, which is at
//! least the popped one. So the order is exact at quiescence, with no update on a touch.
//! Entries pushed in key order cost O(1) (see [`Queue`]): new leaves under `lru` and
//! `fifo` (the latest stamp), under `filo` (the smallest key), and most re-queues. Pair
//! keys (`lfu`, `slru`, `priority`) go to one such queue per value of the pair's first
//! member ([`Levels`]), so that leaves of mixed priorities (or hit counts) still come in
//! order within their level.
//!
//! **Keys that shrink** (`mru`: a touch makes a node's key, minus its last access,
//! smaller): a lower bound would no longer hold, and a stale entry would hide its node
//! behind its old, larger key. So a touch of a queued node re-keys its entry at once
//! ([`EvictIndex::rekey`]), in an ordered map ([`MruMap`]) where an entry can be found by
//! its key and taken out in O(log n): the ticket of an `mru` entry remembers the entry's
//! key ([`MruTicket`]); re-keying removes that entry and inserts one with the node's current
//! key. Nothing stale is left behind (a lazy "push a new entry, drop the old one at pop"
//! would keep one dead entry per touch, and under `mru` the dead ones, having the largest
//! keys, would be popped last: they would pile up). A node's ticket, once cut, removes its
//! entry too. So every entry in the map names a queued node by its current key (at
//! quiescence: see the pair below), and `pop` takes the smallest.
//!
//! **The touch/queue pair (`mru`).** A touch that finds the node not queued (`evq` null)
//! leaves it: whoever queues it later reads the new stamp. That needs an order between the
//! two, since each side writes one place and then reads the other (a touch stores the stamp
//! and reads `evq`; a push stores `evq` and reads the stamp: store buffering). So both
//! accesses to the stamp are RMWs: the touch is `stamp.fetch_max(now, AcqRel)`, then an
//! `evq` load (`RadixTree::touch`); the push stores `evq` (under the lock), then reads the
//! stamp with `fetch_add(0, AcqRel)` ([`MruMap::push`]). The two RMWs are ordered in the
//! stamp's modification order: if the push's comes second it reads the touch's stamp (an
//! RMW reads the latest value); if the touch's comes second it reads from the push's
//! (Release, then Acquire), so the `evq` store happens before the touch's `evq` load, which
//! then sees the node queued and re-keys it under the lock. No SeqCst total order is relied
//! on (as in the unpin/evict pair of `pins.rs`; loom checks this pair:
//! `tests/loom_support/policy.rs`). A pop under `mru` takes the smallest entry as it is: a
//! touch racing it may have made the node's key smaller still (not re-keyed yet), and the
//! node is then all the more the one to take.
//!
//! Memory: an entry names a small [`Ticket`], not the node. A queued node points at its
//! ticket and the ticket at the node; both pointers are written only under this index's
//! lock. Unlinking a node (eviction or split) goes through [`EvictIndex::retire`], which,
//! under the lock, cuts the ticket loose from the node (lazy queue: the ticket's node
//! pointer is nulled and the entry dropped when popped; `mru`: the entry is removed) and
//! hands the node to the epoch at once: a replaced or evicted node is freed as soon as no
//! reader holds it, whether or not the queue ever pops its stale entry (only the 8-byte
//! ticket waits for that). Node locks are always taken before this lock, never after.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use super::EvictionPolicy;
use super::node::{DEAD, Node, PIN_MASK, REPLACED, node_ref};
use super::policy::Keys;
use crate::sync::epoch::{Guard, Shared};
use crate::sync::{Mutex, Ordering, lock, yield_now};

/// What a queue entry names: the node, or null once the node was unlinked. Owned by its
/// entry; read and written only under the index lock.
#[repr(C)]
pub(crate) struct Ticket {
    pub(super) node: *mut Node,
}

/// The ticket of an `mru` entry: the node, and the entry's key in the map (so that a
/// re-key or a cut can find the entry). `repr(C)` with the [`Ticket`] first, so a node's
/// `evq` (a `*mut Ticket`) names it too; in an `mru` index every ticket is one of these.
#[repr(C)]
struct MruTicket {
    base: Ticket,
    key: u64,
    seq: u64,
}

/// `(key, push sequence, ticket address)`: smallest key first, ties in push order (never
/// by address, so the order is deterministic, which loom needs).
pub(super) type Entry<K> = (K, u64, usize);

/// The lazy queue: entries pushed in order of `(key, seq)` go to the back of `run` (sorted
/// by construction), entries smaller than `run`'s front to its front, the others into
/// `heap`; the smallest entry is the smaller of `run`'s front and `heap`'s top, so the
/// order is exactly a single heap's. Most pushes come in order (a new leaf carries the
/// latest stamp, and so does a re-queue unless newer leaves were queued since; under `filo`
/// a new leaf has the smallest key), so most entries cost O(1) and sit in one sequential
/// buffer instead of at the bottom of a deep heap; a parent that became a leaf usually goes
/// to the heap.
pub(super) struct Queue<K> {
    run: VecDeque<Entry<K>>,
    heap: BinaryHeap<Reverse<Entry<K>>>,
    seq: u64,
}

impl<K: Ord + Copy> Default for Queue<K> {
    fn default() -> Self {
        Queue { run: VecDeque::new(), heap: BinaryHeap::new(), seq: 0 }
    }
}

impl<K: Ord + Copy> Queue<K> {
    pub(super) fn push(&mut self, key: K, ticket: *mut Ticket) {
        self.seq += 1;
        let e = (key, self.seq, ticket as usize);
        // `seq` only grows, so `e` is in order at the back exactly when its key is no
        // smaller than the back's, and at the front when it is smaller than the front's.
        if self.run.back().is_none_or(|b| b.0 <= key) {
            self.run.push_back(e);
        } else if self.run.front().is_some_and(|f| key < f.0) {
            self.run.push_front(e);
        } else {
            self.heap.push(Reverse(e));
        }
    }

    pub(super) fn pop(&mut self) -> Option<Entry<K>> {
        match (self.run.front(), self.heap.peek()) {
            (Some(r), Some(Reverse(h))) if h < r => self.heap.pop().map(|Reverse(e)| e),
            (Some(_), _) => self.run.pop_front(),
            (None, _) => self.heap.pop().map(|Reverse(e)| e),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.run.len() + self.heap.len()
    }

    /// Every entry, in no particular order (for `check_entries`).
    pub(super) fn entries(&self) -> impl Iterator<Item = &Entry<K>> {
        self.run.iter().chain(self.heap.iter().map(|Reverse(e)| e))
    }

    /// Gives the buffers' memory back once the queue has been drained (an eviction pass
    /// that took everything, a namespace dropped): a queue that once held a million leaves
    /// does not keep their room forever. Regrowing later is amortized O(1) per push.
    pub(super) fn shrink_when_empty(&mut self) {
        const KEEP: usize = 1024;
        if self.run.capacity() > KEEP {
            self.run = VecDeque::new();
        }
        if self.heap.capacity() > KEEP {
            self.heap = BinaryHeap::new();
        }
    }

    /// Asks the CPU to start loading the node of an entry a few pops ahead (in a big tree
    /// the nodes an eviction pass visits are cache misses, one after the other otherwise).
    /// Only a hint: it reads tickets and one live node's data pointer under the lock.
    #[inline]
    fn prefetch_ahead(&self) {
        // A pipeline: the ticket eight pops ahead, its node four ahead (the ticket is in
        // cache by then), the node's slots two ahead (the node is in cache by then).
        if let Some(&(_, _, addr)) = self.run.get(8) {
            prefetch(addr as *const u8);
        }
        if let Some(&(_, _, addr)) = self.run.get(4) {
            // SAFETY: a queued entry owns its live ticket (freed only by `pop` or Drop under
            // the lock the caller holds).
            let node = unsafe { (*(addr as *const Ticket)).node };
            prefetch(node.cast_const().cast());
        }
        if let Some(&(_, _, addr)) = self.run.get(2) {
            // SAFETY: as above.
            let node = unsafe { (*(addr as *const Ticket)).node };
            // SAFETY: a node named by a ticket is not retired yet (retire cuts the ticket
            // first, under the lock the caller holds), so it is live; its data is immutable.
            if let Some(n) = unsafe { node.as_ref() } {
                prefetch(n.edge.slots_ptr().cast());
            }
        }
    }

    /// Frees every entry's ticket (exclusive access: the index is being dropped).
    pub(super) fn free_tickets(self) {
        for (_, _, addr) in self.heap.into_iter().map(|Reverse(e)| e).chain(self.run) {
            // SAFETY: exclusive access; each entry owns its ticket (never the node), a plain
            // `Ticket` in a lazy queue.
            drop(unsafe { Box::from_raw(addr as *mut Ticket) });
        }
    }
}

/// The lazy queue of pair keys (`lfu`, `slru`, `priority`): one [`Queue`] of stamps per
/// value of the pair's first member (a "level": a hit count, a segment, a priority), the
/// levels in an ordered map, none of them empty. The smallest entry is the smallest of the
/// first level, so the order is exactly one heap's of the pairs. Within a level the stamps
/// mostly come in order (new leaves, re-queues), so most pushes are O(1) as in a [`Queue`],
/// where one heap of pairs would take every push whose first member is not the largest out
/// of order (a tree of leaves of mixed priorities: one O(log n) heap step, a cache miss
/// deep in a big heap, per push and per pop). O(log levels) more per operation.
#[derive(Default)]
struct Levels {
    levels: BTreeMap<u64, Queue<u64>>,
    len: usize,
}

impl Levels {
    fn push(&mut self, key: u128, ticket: *mut Ticket) {
        self.levels.entry((key >> 64) as u64).or_default().push(key as u64, ticket);
        self.len += 1;
    }

    fn pop(&mut self) -> Option<Entry<u128>> {
        let mut level = self.levels.first_entry()?;
        let hi = *level.key();
        let (lo, seq, addr) = level.get_mut().pop().expect("no level is kept empty");
        if level.get().len() == 0 {
            level.remove();
        }
        self.len -= 1;
        Some((((hi as u128) << 64) | lo as u128, seq, addr))
    }

    fn heap_bytes(&self) -> usize {
        let per = std::mem::size_of::<Entry<u64>>();
        self.levels.values().map(|q| (q.heap.capacity() + q.run.capacity()) * per).sum::<usize>()
            + self.levels.len() * (std::mem::size_of::<Queue<u64>>() + 8)
            + self.len * 16
    }

    fn free_tickets(self) {
        for q in self.levels.into_values() {
            q.free_tickets();
        }
    }
}

/// What [`pop_locked`] needs of a lazy queue ([`Queue`] of stamps, [`Levels`] of pairs).
trait Lazy {
    type Key: Ord + Copy;
    fn key_of(keys: &Keys, n: &Node) -> Self::Key;
    fn push(&mut self, key: Self::Key, ticket: *mut Ticket);
    fn pop(&mut self) -> Option<Entry<Self::Key>>;
    /// After a pop that found the queue empty.
    fn on_empty(&mut self);
    fn prefetch_ahead(&self);
}

impl Lazy for Queue<u64> {
    type Key = u64;
    #[inline]
    fn key_of(keys: &Keys, n: &Node) -> u64 {
        // Relaxed: a stamp is an eviction-order hint (re-read at pop).
        keys.narrow(n.stamp.load(Ordering::Relaxed))
    }
    #[inline]
    fn push(&mut self, key: u64, ticket: *mut Ticket) {
        Queue::push(self, key, ticket)
    }
    #[inline]
    fn pop(&mut self) -> Option<Entry<u64>> {
        Queue::pop(self)
    }
    fn on_empty(&mut self) {
        self.shrink_when_empty()
    }
    #[inline]
    fn prefetch_ahead(&self) {
        Queue::prefetch_ahead(self)
    }
}

impl Lazy for Levels {
    type Key = u128;
    #[inline]
    fn key_of(keys: &Keys, n: &Node) -> u128 {
        // Relaxed (both): order hints, re-read at pop.
        keys.wide(n.stamp.load(Ordering::Relaxed), n.meta.load(Ordering::Relaxed))
    }
    #[inline]
    fn push(&mut self, key: u128, ticket: *mut Ticket) {
        Levels::push(self, key, ticket)
    }
    #[inline]
    fn pop(&mut self) -> Option<Entry<u128>> {
        Levels::pop(self)
    }
    fn on_empty(&mut self) {}
    #[inline]
    fn prefetch_ahead(&self) {
        if let Some(q) = self.levels.values().next() {
            q.prefetch_ahead();
        }
    }
}

/// The `mru` index: entries by `(key, seq)`, each naming its [`MruTicket`] (by address);
/// one entry per queued node, always under the key its ticket records.
#[derive(Default)]
struct MruMap {
    map: BTreeMap<(u64, u64), usize>,
    seq: u64,
}

impl MruMap {
    /// Queues `node` (live: the caller checked) or, if it is queued already, re-keys it.
    fn push(&mut self, node: &Node) {
        // Relaxed (`evq`): written only under the index lock, held here.
        let t = node.evq.load(Ordering::Relaxed).cast::<MruTicket>();
        if !t.is_null() {
            self.rekey(node, t);
            return;
        }
        let t = Box::into_raw(Box::new(MruTicket {
            base: Ticket { node: node as *const Node as *mut Node },
            key: 0,
            seq: 0,
        }));
        // The touch/queue pair (module docs): `evq` first, then the stamp read as an RMW.
        node.evq.store(t.cast(), Ordering::Relaxed);
        // AcqRel: the queue half of the touch/queue pair. An RMW reads the latest stamp in
        // its modification order; Release so that a touch whose RMW reads from this one
        // sees the `evq` store above (and re-keys).
        let stamp = node.stamp.fetch_add(0, Ordering::AcqRel);
        self.seq += 1;
        // SAFETY: just allocated; owned by the entry inserted next, under the lock.
        unsafe {
            (*t).key = !stamp;
            (*t).seq = self.seq;
        }
        self.map.insert((!stamp, self.seq), t as usize);
    }

    /// With `t` the ticket of queued `node`: moves its entry to the node's current key if
    /// that is smaller (under `mru` keys only shrink).
    fn rekey(&mut self, node: &Node, t: *mut MruTicket) {
        // Relaxed: under the lock. A touch that asks for this re-key made its RMW on the
        // stamp before, so this load reads that stamp or a newer one (coherence); a newer
        // one's touch re-keys again after it.
        let key = !node.stamp.load(Ordering::Relaxed);
        // SAFETY: `t` is the node's ticket, read from `evq` under the lock the caller holds;
        // tickets are freed only under it, after `evq` is cleared.
        let tk = unsafe { &mut *t };
        if key >= tk.key {
            return;
        }
        let e = self.map.remove(&(tk.key, tk.seq));
        debug_assert_eq!(e, Some(t as usize), "an mru ticket's entry is in the map");
        self.seq += 1;
        (tk.key, tk.seq) = (key, self.seq);
        self.map.insert((key, self.seq), t as usize);
    }

    /// Cuts `n`'s entry (if any): removes it and frees its ticket.
    fn cut(&mut self, n: &Node) {
        // Relaxed: `evq` is written only under the index lock, held here.
        let t = n.evq.swap(std::ptr::null_mut(), Ordering::Relaxed).cast::<MruTicket>();
        if !t.is_null() {
            // SAFETY: the node's ticket, owned by its entry (removed here), under the lock.
            let tk = unsafe { Box::from_raw(t) };
            let e = self.map.remove(&(tk.key, tk.seq));
            debug_assert_eq!(e, Some(t as usize), "an mru ticket's entry is in the map");
        }
    }

    /// Pops as [`pop_locked`] does, under `mru`: the smallest entry, whatever its node's
    /// key is now (module docs).
    fn pop<'g>(&mut self, guard: &'g Guard) -> Popped<'g> {
        for _ in 0..STALE_PER_HOLD {
            let Some((_, addr)) = self.map.pop_first() else {
                return Popped::Empty;
            };
            // SAFETY: the entry just popped owned this ticket; nothing else frees it, and its
            // node no longer names it once `evq` is cleared below (under the lock).
            let t = unsafe { Box::from_raw(addr as *mut MruTicket) };
            // SAFETY: a ticket in the map names a node not retired yet (retire removes the
            // entry first, under this lock); see `pop_locked` on what may be read before
            // the state check.
            let n = unsafe { node_ref(t.base.node, guard) }.expect("mru entries name a node");
            // Relaxed: under the lock.
            n.evq.store(std::ptr::null_mut(), Ordering::Relaxed);
            if is_candidate(n, guard) {
                self.prefetch_ahead();
                return Popped::Leaf(n);
            }
        }
        Popped::Busy
    }

    /// [`Queue::prefetch_ahead`] for the map: the ticket eight pops ahead, the node four
    /// ahead, the node's slots two ahead (a walk of the map's first leaf, in cache).
    #[inline]
    fn prefetch_ahead(&self) {
        let mut next = self.map.values();
        let at = |it: &mut std::collections::btree_map::Values<'_, _, usize>, skip| {
            it.nth(skip).map(|&a| a as *const MruTicket)
        };
        if let Some(t) = at(&mut next, 2) {
            // SAFETY: an entry's ticket is live (freed only under the lock the caller holds),
            // and it names a node not retired yet (retire removes the entry first, under
            // that lock): both are valid; the node's data is immutable.
            if let Some(n) = unsafe { (*t).base.node.as_ref() } {
                prefetch(n.edge.slots_ptr().cast());
            }
        }
        if let Some(t) = at(&mut next, 1) {
            // SAFETY: as above (entry 4).
            prefetch(unsafe { (*t).base.node }.cast_const().cast());
        }
        if let Some(t) = at(&mut next, 3) {
            prefetch(t.cast()); // entry 8
        }
    }

    /// Frees every entry's ticket (exclusive access: the index is being dropped).
    fn free_tickets(self) {
        for addr in self.map.into_values() {
            // SAFETY: exclusive access; each entry owns its ticket, an `MruTicket`.
            drop(unsafe { Box::from_raw(addr as *mut MruTicket) });
        }
    }
}

/// The index's queue, by the shape of the policy's keys.
enum Queues {
    /// Keys that are the stamp alone (`lru`, `fifo`, `filo`).
    Narrow(Queue<u64>),
    /// Pairs (`lfu`, `slru`, `priority`).
    Wide(Levels),
    /// `mru`: keys that shrink.
    Mru(MruMap),
}

impl Queues {
    fn new(policy: EvictionPolicy) -> Queues {
        match policy {
            EvictionPolicy::Mru => Queues::Mru(MruMap::default()),
            EvictionPolicy::Lfu | EvictionPolicy::Slru | EvictionPolicy::Priority => {
                Queues::Wide(Levels::default())
            }
            EvictionPolicy::Lru | EvictionPolicy::Fifo | EvictionPolicy::Filo => {
                Queues::Narrow(Queue::default())
            }
        }
    }

    fn len(&self) -> usize {
        match self {
            Queues::Narrow(q) => q.len(),
            Queues::Wide(q) => q.len,
            Queues::Mru(m) => m.map.len(),
        }
    }
}

/// A prefetch hint for the cache line at `p` (and the next); a no-op where unsupported.
/// Never faults, whatever `p` is.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: a prefetch is a hint that never faults or changes memory, for any
        // address; SSE is part of the x86_64 baseline.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(p.cast());
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64).cast());
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    let _ = p;
}

/// See the module docs.
pub(crate) struct EvictIndex {
    queue: Mutex<Queues>,
    keys: Keys,
}

impl EvictIndex {
    pub(crate) fn new(keys: Keys) -> Self {
        EvictIndex { queue: Mutex::new(Queues::new(keys.policy)), keys }
    }

    /// Queues `node` if it is live and not queued already (`mru`: or re-keys it). The
    /// caller decided it is an unpinned leaf; `pop` re-checks. `node` must be valid for the
    /// caller's guard and not yet retired (the caller reached it under its guard and it is
    /// still linked, or was until the caller unlinked it and has not retired it yet).
    pub(crate) fn push(&self, node: &Node) {
        push_locked(&mut lock(&self.queue), &self.keys, node);
    }

    /// `mru`: a touch made `node`'s key smaller and found it queued (the touch/queue pair,
    /// module docs): moves its entry to the new key, if it is still queued. `node` must be
    /// valid for the caller's guard (reached through the tree under it).
    pub(crate) fn rekey(&self, node: &Node) {
        let mut q = lock(&self.queue);
        if let Queues::Mru(m) = &mut *q {
            // Relaxed: under the lock, which orders every write of `evq`.
            let t = node.evq.load(Ordering::Relaxed).cast::<MruTicket>();
            if !t.is_null() {
                m.rekey(node, t);
            }
        }
    }

    /// Hands `node` (unlinked from the tree, marked DEAD or REPLACED) to the epoch, first
    /// cutting its queue entry (if any) loose from it.
    pub(crate) fn retire(&self, node: *mut Node, guard: &Guard) {
        {
            let mut q = lock(&self.queue);
            // SAFETY: the caller unlinked `node` under its guard; nothing has freed it,
            // since only this function and `pop_after` hand nodes to the epoch.
            cut_ticket(&mut q, unsafe { node_ref(node, guard) }.expect("retire of null"));
        }
        // SAFETY: `node` is unlinked: no child table, parent field or (now) ticket names
        // it, so a thread pinned after this cannot reach it that way. A `forward` pointer
        // may still name it (the node it replaced may be retired later), but `forward` is
        // followed only from a node that was reachable after the follower's guard was
        // pinned, and then this node was too (see the `descent` module), so the epoch
        // keeps it for every guard that can still reach it.
        unsafe { guard.defer_destroy(Shared::from(node.cast_const())) };
    }

    /// One step of an eviction pass, under one lock: retires `done.evicted` as
    /// [`EvictIndex::retire`] does, queues `done.parent` (non-null: its last child was just
    /// evicted) as [`EvictIndex::push`] does, then, with `next`, pops as
    /// [`pop_locked`] does. The pass takes the index lock once per leaf instead of
    /// three times, and the order of events is the same as the three calls in a row.
    pub(crate) fn pop_after<'g>(
        &self,
        done: Option<Evicted>,
        next: bool,
        guard: &'g Guard,
    ) -> Option<&'g Node> {
        let mut q = lock(&self.queue);
        if let Some(d) = &done {
            // SAFETY: `d.node` was unlinked by the caller under `guard`, and not handed to
            // the epoch: only this call does that (below), so it is alive.
            cut_ticket(&mut q, unsafe { node_ref(d.node, guard) }.expect("retire of null"));
            // SAFETY: the parent was read from the evicted node's parent field under
            // `guard`, under the parent's lock, while the node was linked below it: it was
            // linked then, after `guard` was pinned, so the epoch keeps it for `guard`
            // (another pass may have evicted and retired it since: `push_locked` then sees
            // DEAD and skips it).
            if let Some(parent) = unsafe { node_ref(d.parent.cast_mut(), guard) } {
                push_locked(&mut q, &self.keys, parent);
            }
        }
        let popped = loop {
            if !next {
                break None;
            }
            let p = match &mut *q {
                Queues::Narrow(lq) => pop_locked(lq, &self.keys, guard),
                Queues::Wide(lq) => pop_locked(lq, &self.keys, guard),
                Queues::Mru(m) => m.pop(guard),
            };
            match p {
                Popped::Leaf(n) => break Some(n),
                Popped::Empty => break None,
                Popped::Busy => {
                    // Bound the time a waiting split or release spends on this lock.
                    drop(q);
                    yield_now();
                    q = lock(&self.queue);
                }
            }
        };
        drop(q);
        if let Some(d) = done {
            // SAFETY: as in `retire`: unlinked, and its ticket is cut.
            unsafe { guard.defer_destroy(Shared::from(d.node.cast_const())) };
        }
        popped
    }

    /// Entries queued (some may be stale).
    pub(crate) fn len(&self) -> usize {
        lock(&self.queue).len()
    }

    /// Heap bytes of the index (entries and their tickets; for `mru`, an estimate of the
    /// ordered map's nodes).
    pub(crate) fn heap_bytes(&self) -> usize {
        let q = lock(&self.queue);
        match &*q {
            Queues::Narrow(lq) => {
                (lq.heap.capacity() + lq.run.capacity()) * std::mem::size_of::<Entry<u64>>()
                    + lq.len() * 16
            }
            Queues::Wide(lv) => lv.heap_bytes(),
            // A B-tree node holds up to 11 entries of 24 bytes and is about two thirds full.
            Queues::Mru(m) => m.map.len() * (24 * 3 / 2 + std::mem::size_of::<MruTicket>().max(16)),
        }
    }

    /// For `check_invariants` (quiescent): `Err` if an entry names a node that is `DEAD` or
    /// `REPLACED` (every such node is retired at quiescence, and retiring cuts its ticket),
    /// or, in a lazy queue, if an entry's key is above its node's current key (the lower
    /// bound of the module docs, which makes the order exact). O(entries).
    pub(crate) fn check_entries(&self, g: &Guard) -> Result<(), String> {
        let q = lock(&self.queue);
        match &*q {
            Queues::Narrow(lq) => lq
                .entries()
                .try_for_each(|&(k, _, a)| check_entry(&self.keys, Some(k as u128), a, g)),
            Queues::Wide(lv) => lv.levels.iter().try_for_each(|(&hi, lq)| {
                lq.entries().try_for_each(|&(lo, _, a)| {
                    check_entry(&self.keys, Some(((hi as u128) << 64) | lo as u128), a, g)
                })
            }),
            Queues::Mru(m) => m.map.values().try_for_each(|&a| check_entry(&self.keys, None, a, g)),
        }
    }

    /// For `check_invariants` (quiescent): `Err` unless the unpinned leaf `n` is queued
    /// and, under `mru`, its entry carries its current key.
    pub(crate) fn check_queued(&self, n: &Node) -> Result<(), String> {
        let q = lock(&self.queue);
        // Relaxed: under the lock.
        let t = n.evq.load(Ordering::Relaxed);
        if t.is_null() {
            return Err("an unpinned leaf is not in the eviction index".into());
        }
        if let Queues::Mru(m) = &*q {
            // SAFETY: the node's ticket, read under the lock; an `MruTicket` in an `mru` index.
            let tk = unsafe { &*t.cast::<MruTicket>() };
            // Relaxed: quiescent.
            let key = !n.stamp.load(Ordering::Relaxed);
            if tk.key != key || m.map.get(&(tk.key, tk.seq)) != Some(&(t as usize)) {
                return Err(format!(
                    "an mru entry under key {:#x}, its node's key is {key:#x}",
                    tk.key
                ));
            }
        }
        Ok(())
    }
}

/// For [`EvictIndex::check_entries`]: one entry of a queue, `key` the key it was queued
/// under (`None` under `mru`, whose keys `check_queued` checks), `addr` its ticket.
fn check_entry(keys: &Keys, key: Option<u128>, addr: usize, g: &Guard) -> Result<(), String> {
    // SAFETY: a queued entry owns its ticket (freed only under the index lock, which the
    // caller holds); in an `mru` index the `Ticket` is the first field of an `MruTicket`.
    let ptr = unsafe { (*(addr as *const Ticket)).node };
    // SAFETY: a ticket names its node only until the node is retired (`cut_ticket`, under
    // the lock, before the node goes to the epoch), so a non-null one names a node that is
    // not freed (under loom, `node_ref` checks the canary: a ticket left naming a freed node
    // fails here).
    let Some(n) = (unsafe { node_ref(ptr, g) }) else {
        return Ok(()); // cut: its node was retired, the entry goes when popped
    };
    // Relaxed (both loads): quiescent.
    let s = n.state.load(Ordering::Relaxed);
    if s & (DEAD | REPLACED) != 0 {
        return Err(format!("a queue entry names a node in state {s:#x} (retired, not cut)"));
    }
    let Some(key) = key else { return Ok(()) };
    let now = match keys.policy {
        EvictionPolicy::Lfu | EvictionPolicy::Slru | EvictionPolicy::Priority => {
            <Levels as Lazy>::key_of(keys, n)
        }
        _ => <Queue<u64> as Lazy>::key_of(keys, n) as u128,
    };
    if key > now {
        return Err(format!(
            "a queue entry's key {key:#x} is above its node's key {now:#x} (not a lower bound)"
        ));
    }
    Ok(())
}

/// An evicted leaf waiting for [`EvictIndex::pop_after`]: the node (unlinked, DEAD, its
/// slots handed over, not yet retired) and its parent if the eviction left the parent a
/// leaf that may be queued (else null).
pub(crate) struct Evicted {
    pub(crate) node: *mut Node,
    pub(crate) parent: *const Node,
}

/// [`EvictIndex::push`] with the lock held.
fn push_locked(q: &mut Queues, keys: &Keys, node: &Node) {
    // Relaxed: a filter only (`pop_locked` re-checks with Acquire). Memory safety does not
    // depend on it: a node retired before this lock was taken had its DEAD or REPLACED
    // set before that retire's ticket cut, under this lock, so the lock makes the bit
    // visible here; one retired later has its ticket (this one too) cut after us.
    if node.state.load(Ordering::Relaxed) & (DEAD | REPLACED) != 0 {
        return;
    }
    let q = match q {
        Queues::Narrow(lq) => return push_lazy(lq, keys, node),
        Queues::Wide(lq) => return push_lazy(lq, keys, node),
        Queues::Mru(m) => m,
    };
    q.push(node);
}

/// [`push_locked`] into a lazy queue: a new entry with the node's current key, unless it
/// has one (whose key is a lower bound of the current one: `pop` re-queues it).
fn push_lazy<Q: Lazy>(q: &mut Q, keys: &Keys, node: &Node) {
    // Relaxed (`evq`, here and below): written only under the index lock.
    if !node.evq.load(Ordering::Relaxed).is_null() {
        return;
    }
    let t = Box::into_raw(Box::new(Ticket { node: node as *const Node as *mut Node }));
    node.evq.store(t, Ordering::Relaxed);
    q.push(Q::key_of(keys, node), t);
}

/// With the index lock held: cuts the queue entry of `n` (if any) loose from it.
fn cut_ticket(q: &mut Queues, n: &Node) {
    if let Queues::Mru(m) = q {
        return m.cut(n);
    }
    // Relaxed: `evq` is written only under the index lock.
    let t = n.evq.swap(std::ptr::null_mut(), Ordering::Relaxed);
    if !t.is_null() {
        // SAFETY: a node's ticket is owned by its queue entry and is freed only by
        // `pop_locked` (or Drop) under the lock the caller holds, after reading it.
        unsafe { (*t).node = std::ptr::null_mut() };
    }
}

/// Stale entries `pop_locked` may drop or re-queue per lock hold: past it, the pass lets
/// the lock go (a split queueing its lower half, or a release whose unpin made a leaf
/// evictable, waits on this lock) and takes it again.
pub(super) const STALE_PER_HOLD: usize = 32;

/// What [`pop_locked`] found.
enum Popped<'g> {
    /// A live, unpinned leaf carrying its current key.
    Leaf(&'g Node),
    /// The queue is empty.
    Empty,
    /// [`STALE_PER_HOLD`] stale entries were handled; more may follow.
    Busy,
}

/// With the index lock held, for a node `n` named by a ticket popped under `guard`: whether
/// it is a candidate, a live unpinned leaf.
///
/// It may have been unlinked before `guard` was pinned: until the state check says it is
/// live, only its own fields may be read (not its table, which L of a split took over and
/// may have retired, nor `forward`).
#[inline]
fn is_candidate(n: &Node, guard: &Guard) -> bool {
    // Acquire: pairs with the Release of the CAS that set DEAD or REPLACED (and of the
    // table stores, for `is_leaf` below).
    let s = n.state.load(Ordering::Acquire);
    // Memory safety depends on this order: the state first. Neither bit set means the
    // node is linked now (both are set before it is unlinked), so it was reachable
    // after `guard` was pinned and its table is valid for `guard`.
    s & (DEAD | REPLACED | PIN_MASK) == 0 && n.is_leaf(guard)
}

/// With the index lock held: pops the best candidate of a lazy queue, a live, unpinned leaf
/// whose entry carries its current key. An entry whose node's key grew is re-queued with
/// the new key. Handles at most [`STALE_PER_HOLD`] stale entries per call.
fn pop_locked<'g, Q: Lazy>(q: &mut Q, keys: &Keys, guard: &'g Guard) -> Popped<'g> {
    for _ in 0..STALE_PER_HOLD {
        let Some((key, _, addr)) = q.pop() else {
            q.on_empty();
            return Popped::Empty;
        };
        let t = addr as *mut Ticket;
        // SAFETY: tickets are freed only here (or in Drop), under the lock.
        let ptr = unsafe { (*t).node };
        if ptr.is_null() {
            // SAFETY: the entry we just popped was the ticket's only owner.
            drop(unsafe { Box::from_raw(t) });
            continue;
        }
        // SAFETY: a node named by a ticket is not retired yet (retire cuts the ticket
        // first, under this lock), so its memory is valid; `guard` keeps it so after we
        // unlock (see `is_candidate` on what may be read).
        let n = unsafe { node_ref(ptr, guard) }.expect("checked non-null");
        if !is_candidate(n, guard) {
            // No longer a candidate; re-queued by its next transition.
            // Relaxed: `evq` is written only under the index lock.
            n.evq.store(std::ptr::null_mut(), Ordering::Relaxed);
            // SAFETY: as above; the node no longer names it.
            drop(unsafe { Box::from_raw(t) });
            continue;
        }
        let now = Q::key_of(keys, n);
        if now > key {
            q.push(now, t); // same ticket, the key it has grown to
            continue;
        }
        // Relaxed: `evq` is written only under the index lock.
        n.evq.store(std::ptr::null_mut(), Ordering::Relaxed);
        // SAFETY: as above.
        drop(unsafe { Box::from_raw(t) });
        q.prefetch_ahead();
        return Popped::Leaf(n);
    }
    Popped::Busy
}

impl Drop for EvictIndex {
    fn drop(&mut self) {
        let q = std::mem::replace(&mut *lock(&self.queue), Queues::new(self.keys.policy));
        match q {
            Queues::Narrow(lq) => lq.free_tickets(),
            Queues::Wide(lq) => lq.free_tickets(),
            Queues::Mru(m) => m.free_tickets(),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The levels of pair keys pop exactly what one heap of the pairs would.
    #[test]
    fn levels_pop_in_the_order_of_a_single_heap() {
        let mut q = Levels::default();
        let mut reference: BinaryHeap<Reverse<(u128, usize)>> = BinaryHeap::new();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut now = 0u64;
        for step in 0..20_000usize {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x.is_multiple_of(3) {
                let got = q.pop().map(|(k, _, a)| (k, a));
                assert_eq!(got, reference.pop().map(|Reverse(e)| e), "step {step}");
            } else {
                now += 1 + x % 2;
                let stamp = if x.is_multiple_of(7) { now.saturating_sub(x % 40) } else { now };
                let key = (((x >> 20) % 4) as u128) << 64 | stamp as u128;
                q.push(key, step as *mut Ticket);
                reference.push(Reverse((key, step)));
            }
            assert_eq!(q.len, reference.len());
            assert!(q.levels.values().all(|l| l.len() > 0));
        }
        while let Some(Reverse(e)) = reference.pop() {
            assert_eq!(q.pop().map(|(k, _, a)| (k, a)), Some(e));
        }
        assert!(q.pop().is_none() && q.levels.is_empty());
    }

    /// The deque-plus-heap queue pops exactly what one heap would, in the same order, for
    /// pushes in and out of key order (both ways) interleaved with pops.
    #[test]
    fn queue_pops_in_the_order_of_a_single_heap() {
        for descending in [false, true] {
            let mut q = Queue::<u64>::default();
            let mut reference: BinaryHeap<Reverse<Entry<u64>>> = BinaryHeap::new();
            let mut seq = 0u64;
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            let mut now = 0u64;
            let (mut back, mut front, mut heap) = (0, 0, 0);
            for step in 0..20_000u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if x.is_multiple_of(3) {
                    assert_eq!(q.pop(), reference.pop().map(|Reverse(e)| e), "step {step}");
                } else {
                    // Mostly the newest stamp, sometimes an older one (a parent that became
                    // a leaf), sometimes the same as the last (ties go by push order); the
                    // keys descending as `filo`'s do, or ascending.
                    now += x % 2;
                    let stamp = if x.is_multiple_of(5) { now.saturating_sub(x % 50) } else { now };
                    let key = if descending { !stamp } else { stamp };
                    if q.run.back().is_none_or(|b| b.0 <= key) {
                        back += 1;
                    } else if q.run.front().is_some_and(|f| key < f.0) {
                        front += 1;
                    } else {
                        heap += 1;
                    }
                    q.push(key, step as usize as *mut Ticket);
                    seq += 1;
                    reference.push(Reverse((key, seq, step as usize)));
                }
                assert_eq!(q.len(), reference.len());
            }
            assert!(back + front > 1000 && heap > 1000, "{back} {front} {heap}");
            while let Some(Reverse(e)) = reference.pop() {
                assert_eq!(q.pop(), Some(e));
            }
            assert_eq!(q.pop(), None);
        }
    }
}
