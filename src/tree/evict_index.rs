//! The eviction index: a lazy priority queue of evictable leaves.
//!
//! A leaf enters when it is created unpinned, when its pin count drops to 0, when its last
//! child is evicted, or when it is the lower half of a split of such a leaf. Entries are
//! never updated in place: `pop` checks an entry against the node's current state and stamp
//! and drops it (no longer a candidate) or re-queues it with the newer stamp (lazy LRU).
//! Every operation is O(log n) in the number of queued leaves, and O(1) for entries queued
//! in stamp order (most of them: see [`Queue`]); nothing scans the tree and no heap is
//! rebuilt per call.
//!
//! Memory: an entry names a small [`Ticket`], not the node. A queued node points at its
//! ticket and the ticket at the node; both pointers are read and written only under this
//! index's lock. Unlinking a node (eviction or split) goes through [`EvictIndex::retire`],
//! which, under the lock, cuts the ticket's pointer and hands the node to the epoch at once:
//! a replaced or evicted node is freed as soon as no reader holds it, whether or not the
//! queue ever pops its stale entry (only the 8-byte ticket waits for that). Node locks are
//! always taken before this lock, never after.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::node::{DEAD, Node, PIN_MASK, REPLACED, node_ref};
use crate::sync::epoch::{Guard, Shared};
use crate::sync::{Mutex, Ordering, lock, yield_now};

/// What a queue entry names: the node, or null once the node was unlinked. Owned by its
/// entry; read and written only under the index lock.
pub(crate) struct Ticket {
    node: *mut Node,
}

/// `(stamp, push sequence, ticket address)`: smallest stamp first, ties in push order
/// (never by address, so the order is deterministic, which loom needs).
type Entry = Reverse<(u64, u64, usize)>;

/// The queue: entries pushed in order of `(stamp, seq)` go to the back of `run` (sorted by
/// construction), the others into `heap`; the smallest entry is the smaller of `run`'s
/// front and `heap`'s top, so the order is exactly a single heap's. Most pushes come in
/// order (a new leaf carries the latest stamp, and so does a re-queue unless newer leaves
/// were queued since), so most entries cost O(1) and sit in one sequential buffer instead
/// of at the bottom of a deep heap; a parent that became a leaf usually goes to the heap.
#[derive(Default)]
struct Queue {
    run: VecDeque<(u64, u64, usize)>,
    heap: BinaryHeap<Entry>,
    seq: u64,
}

impl Queue {
    fn push(&mut self, stamp: u64, ticket: *mut Ticket) {
        self.seq += 1;
        let e = (stamp, self.seq, ticket as usize);
        // `seq` only grows, so `e` is in order exactly when its stamp is no older.
        if self.run.back().is_none_or(|b| b.0 <= stamp) {
            self.run.push_back(e);
        } else {
            self.heap.push(Reverse(e));
        }
    }

    fn pop(&mut self) -> Option<(u64, u64, usize)> {
        match (self.run.front(), self.heap.peek()) {
            (Some(r), Some(Reverse(h))) if h < r => self.heap.pop().map(|Reverse(e)| e),
            (Some(_), _) => self.run.pop_front(),
            (None, _) => self.heap.pop().map(|Reverse(e)| e),
        }
    }

    fn len(&self) -> usize {
        self.run.len() + self.heap.len()
    }

    /// Gives the buffers' memory back once the queue has been drained (an eviction pass
    /// that took everything, a namespace dropped): a queue that once held a million leaves
    /// does not keep their room forever. Regrowing later is amortized O(1) per push.
    fn shrink_when_empty(&mut self) {
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
}

/// A prefetch hint for the cache line at `p` (and the next); a no-op where unsupported.
/// Never faults, whatever `p` is.
#[inline(always)]
fn prefetch(p: *const u8) {
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
    queue: Mutex<Queue>,
}

impl EvictIndex {
    pub(crate) fn new() -> Self {
        EvictIndex { queue: Mutex::new(Queue::default()) }
    }

    /// Queues `node` if it is live and not queued already. The caller decided it is an
    /// unpinned leaf; `pop` re-checks. `node` must be valid for the caller's guard and
    /// not yet retired (the caller reached it under its guard and it is still linked, or
    /// was until the caller unlinked it and has not retired it yet).
    pub(crate) fn push(&self, node: &Node) {
        push_locked(&mut lock(&self.queue), node);
    }

    /// Hands `node` (unlinked from the tree, marked DEAD or REPLACED) to the epoch, first
    /// cutting its queue entry (if any) loose from it.
    pub(crate) fn retire(&self, node: *mut Node, guard: &Guard) {
        {
            let _q = lock(&self.queue);
            // SAFETY: the caller unlinked `node` under its guard; nothing has freed it,
            // since only this function and `pop_after` hand nodes to the epoch.
            cut_ticket(unsafe { node_ref(node, guard) }.expect("retire of null"));
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
        lru: bool,
        guard: &'g Guard,
    ) -> Option<&'g Node> {
        let mut q = lock(&self.queue);
        if let Some(d) = &done {
            // SAFETY: `d.node` was unlinked by the caller under `guard`, and not handed to
            // the epoch: only this call does that (below), so it is alive.
            cut_ticket(unsafe { node_ref(d.node, guard) }.expect("retire of null"));
            // SAFETY: the parent was read from the evicted node's parent field under
            // `guard`, under the parent's lock, while the node was linked below it: it was
            // linked then, after `guard` was pinned, so the epoch keeps it for `guard`
            // (another pass may have evicted and retired it since: `push_locked` then sees
            // DEAD and skips it).
            if let Some(parent) = unsafe { node_ref(d.parent.cast_mut(), guard) } {
                push_locked(&mut q, parent);
            }
        }
        let popped = loop {
            if !next {
                break None;
            }
            match pop_locked(&mut q, lru, guard) {
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

    /// Heap bytes of the index (entries and their tickets).
    pub(crate) fn heap_bytes(&self) -> usize {
        let q = lock(&self.queue);
        (q.heap.capacity() + q.run.capacity()) * std::mem::size_of::<Entry>() + q.len() * 16
    }
}

/// An evicted leaf waiting for [`EvictIndex::pop_after`]: the node (unlinked, DEAD, its
/// slots handed over, not yet retired) and its parent if the eviction left the parent a
/// leaf that may be queued (else null).
pub(crate) struct Evicted {
    pub(crate) node: *mut Node,
    pub(crate) parent: *const Node,
}

/// [`EvictIndex::push`] with the lock held.
fn push_locked(q: &mut Queue, node: &Node) {
    // Relaxed: a filter only (`pop_locked` re-checks with Acquire). Memory safety does not
    // depend on it: a node retired before this lock was taken had its DEAD or REPLACED
    // set before that retire's ticket cut, under this lock, so the lock makes the bit
    // visible here; one retired later has its ticket (this one too) cut after us.
    if node.state.load(Ordering::Relaxed) & (DEAD | REPLACED) != 0 {
        return;
    }
    // Relaxed (`evq`, here and below): read and written only under the index lock.
    if !node.evq.load(Ordering::Relaxed).is_null() {
        return;
    }
    let t = Box::into_raw(Box::new(Ticket { node: node as *const Node as *mut Node }));
    node.evq.store(t, Ordering::Relaxed);
    // Relaxed: a stamp is an eviction-order hint (re-read at pop).
    q.push(node.stamp.load(Ordering::Relaxed), t);
}

/// With the index lock held: cuts the queue entry of `n` (if any) loose from it.
fn cut_ticket(n: &Node) {
    // Relaxed: `evq` is read and written only under the index lock.
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
const STALE_PER_HOLD: usize = 32;

/// What [`pop_locked`] found.
enum Popped<'g> {
    /// A live, unpinned leaf carrying its current stamp.
    Leaf(&'g Node),
    /// The queue is empty.
    Empty,
    /// [`STALE_PER_HOLD`] stale entries were handled; more may follow.
    Busy,
}

/// With the index lock held: pops the best candidate, a live, unpinned leaf whose entry
/// carries its current stamp. With `lru`, an entry older than its node's stamp is re-queued
/// with the newer stamp. Handles at most [`STALE_PER_HOLD`] stale entries per call.
fn pop_locked<'g>(q: &mut Queue, lru: bool, guard: &'g Guard) -> Popped<'g> {
    for _ in 0..STALE_PER_HOLD {
        let Some((stamp, _, addr)) = q.pop() else {
            q.shrink_when_empty();
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
        // unlock. It may have been unlinked before `guard` was pinned, though: until the
        // state check below says it is live, only its own fields may be read (not its
        // table, which L of a split took over and may have retired, nor `forward`).
        let n = unsafe { node_ref(ptr, guard) }.expect("checked non-null");
        // Acquire: pairs with the Release of the CAS that set DEAD or REPLACED (and of the
        // table stores, for `is_leaf` below).
        let s = n.state.load(Ordering::Acquire);
        // Memory safety depends on this order: the state first. Neither bit set means the
        // node is linked now (both are set before it is unlinked), so it was reachable
        // after `guard` was pinned and its table is valid for `guard`.
        let stale =
            if s & (DEAD | REPLACED) != 0 { true } else { s & PIN_MASK != 0 || !n.is_leaf(guard) };
        if stale {
            // No longer a candidate; re-queued by its next transition.
            n.evq.store(std::ptr::null_mut(), Ordering::Relaxed);
            // SAFETY: as above; the node no longer names it.
            drop(unsafe { Box::from_raw(t) });
            continue;
        }
        // Relaxed: a stamp is an eviction-order hint.
        let now = n.stamp.load(Ordering::Relaxed);
        if lru && now > stamp {
            q.push(now, t); // same ticket, newer stamp
            continue;
        }
        // Relaxed: `evq` is read and written only under the index lock.
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
        let q = std::mem::take(&mut *lock(&self.queue));
        for (_, _, addr) in q.heap.into_iter().map(|Reverse(e)| e).chain(q.run) {
            // SAFETY: exclusive access; each entry owns its ticket (never the node).
            drop(unsafe { Box::from_raw(addr as *mut Ticket) });
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The deque-plus-heap queue pops exactly what one heap would, in the same order, for
    /// pushes in and out of stamp order interleaved with pops.
    #[test]
    fn queue_pops_in_the_order_of_a_single_heap() {
        let mut q = Queue::default();
        let mut reference: BinaryHeap<Entry> = BinaryHeap::new();
        let mut seq = 0u64;
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut now = 0u64;
        let (mut in_order, mut out_of_order) = (0, 0);
        for step in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x.is_multiple_of(3) {
                assert_eq!(q.pop(), reference.pop().map(|Reverse(e)| e), "step {step}");
            } else {
                // Mostly the newest stamp, sometimes an older one (a parent that became a
                // leaf), sometimes the same as the last (ties go by push order).
                now += x % 2;
                let stamp = if x.is_multiple_of(5) { now.saturating_sub(x % 50) } else { now };
                if q.run.back().is_none_or(|b| b.0 <= stamp) {
                    in_order += 1;
                } else {
                    out_of_order += 1;
                }
                q.push(stamp, step as usize as *mut Ticket);
                seq += 1;
                reference.push(Reverse((stamp, seq, step as usize)));
            }
            assert_eq!(q.len(), reference.len());
        }
        assert!(in_order > 1000 && out_of_order > 1000, "{in_order} {out_of_order}");
        while let Some(Reverse(e)) = reference.pop() {
            assert_eq!(q.pop(), Some(e));
        }
        assert_eq!(q.pop(), None);
    }
}
