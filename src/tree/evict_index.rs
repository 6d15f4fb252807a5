//! The eviction index: a lazy priority queue of evictable leaves.
//!
//! A leaf enters when it is created unpinned, when its pin count drops to 0, when its last
//! child is evicted, or when it is the lower half of a split of such a leaf. Entries are
//! never updated in place: `pop` checks an entry against the node's current state and stamp
//! and drops it (no longer a candidate) or re-queues it with the newer stamp (lazy LRU).
//! Every operation is O(log n) in the number of queued leaves; nothing scans the tree and no
//! heap is rebuilt per call.
//!
//! Memory: a node named by an entry is never freed. Unlinking a node (eviction or split)
//! goes through [`EvictIndex::retire`] under this index's lock: a queued node is only marked
//! [`RETIRE_PENDING`], and the `pop` that takes its entry retires it. Node locks are always
//! taken before this lock, never after.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::node::{DEAD, Node, PIN_MASK, QUEUED, REPLACED, RETIRE_PENDING, node_ref};
use crate::sync::epoch::{Guard, Shared};
use crate::sync::{Mutex, Ordering, lock};

/// `(stamp, push sequence, node address)`: smallest stamp first, ties in push order (never
/// by address, so the order is deterministic, which loom needs).
type Entry = Reverse<(u64, u64, usize)>;

/// The queue and its push counter.
#[derive(Default)]
struct Queue {
    heap: BinaryHeap<Entry>,
    seq: u64,
}

impl Queue {
    fn push(&mut self, stamp: u64, addr: usize) {
        self.seq += 1;
        self.heap.push(Reverse((stamp, self.seq, addr)));
    }
}

/// See the module docs.
pub(crate) struct EvictIndex {
    heap: Mutex<Queue>,
}

impl EvictIndex {
    pub(crate) fn new() -> Self {
        EvictIndex { heap: Mutex::new(Queue::default()) }
    }

    /// Queues `node` if it is live and not queued already. The caller decided it is an
    /// unpinned leaf; `pop` re-checks.
    pub(crate) fn push(&self, node: &Node) {
        let mut heap = lock(&self.heap);
        if node.state.load(Ordering::SeqCst) & (DEAD | REPLACED) != 0 {
            return;
        }
        let f = node.evq.load(Ordering::Relaxed);
        if f & QUEUED != 0 {
            return;
        }
        node.evq.store(f | QUEUED, Ordering::Relaxed);
        let stamp = node.stamp.load(Ordering::Relaxed);
        heap.push(stamp, node as *const Node as usize);
    }

    /// Hands `node` (unlinked from the tree, marked DEAD or REPLACED) to the epoch, or
    /// leaves that to the `pop` of its pending entry.
    pub(crate) fn retire(&self, node: *mut Node, guard: &Guard) {
        let _heap = lock(&self.heap);
        // SAFETY: the caller unlinked `node` under its guard; it is not freed yet because
        // only this function (under the index lock) or `pop` hands it to the epoch.
        let n = unsafe { node_ref(node, guard) }.expect("retire of null");
        let f = n.evq.load(Ordering::Relaxed);
        if f & QUEUED != 0 {
            n.evq.store(f | RETIRE_PENDING, Ordering::Relaxed);
        } else {
            // SAFETY: `node` is unlinked (no table, root or forward pointer published after
            // now leads to it, except a forward pointer of a node retired no later than it),
            // and it is not queued, so no thread pinned after this point can reach it.
            unsafe { guard.defer_destroy(Shared::from(node.cast_const())) };
        }
    }

    /// Pops the best candidate: a live, unpinned leaf whose entry carries its current stamp.
    /// With `lru`, an entry older than its node's stamp is re-queued with the newer stamp.
    pub(crate) fn pop<'g>(&self, lru: bool, guard: &'g Guard) -> Option<&'g Node> {
        let mut heap = lock(&self.heap);
        while let Some(Reverse((stamp, _, addr))) = heap.heap.pop() {
            let ptr = addr as *mut Node;
            // SAFETY: a queued node is never freed (see `retire`), and we hold the lock.
            let n = unsafe { node_ref(ptr, guard) }.expect("null in index");
            let f = n.evq.load(Ordering::Relaxed);
            n.evq.store(0, Ordering::Relaxed);
            if f & RETIRE_PENDING != 0 {
                // SAFETY: unlinked and no longer queued: nothing can reach it from now on.
                unsafe { guard.defer_destroy(Shared::from(ptr.cast_const())) };
                continue;
            }
            let s = n.state.load(Ordering::SeqCst);
            if s & (DEAD | REPLACED) != 0 || s & PIN_MASK != 0 || !n.is_leaf(guard) {
                continue; // no longer a candidate; re-queued by its next transition
            }
            let now = n.stamp.load(Ordering::Relaxed);
            if lru && now > stamp {
                n.evq.store(QUEUED, Ordering::Relaxed);
                heap.push(now, addr);
                continue;
            }
            return Some(n);
        }
        None
    }

    /// Entries queued (some may be stale).
    pub(crate) fn len(&self) -> usize {
        lock(&self.heap).heap.len()
    }

    /// Heap bytes of the index.
    pub(crate) fn heap_bytes(&self) -> usize {
        lock(&self.heap).heap.capacity() * std::mem::size_of::<Entry>()
    }

    /// For the tree's `Drop` (exclusive access): the nodes whose retirement is pending,
    /// which only the index still names.
    pub(crate) fn take_pending(&mut self) -> Vec<*mut Node> {
        let heap = std::mem::take(&mut lock(&self.heap).heap);
        let mut out = Vec::new();
        for Reverse((_, _, addr)) in heap {
            let ptr = addr as *mut Node;
            // SAFETY: exclusive access in Drop; queued nodes are not freed yet.
            let f = unsafe { (*ptr).evq.load(Ordering::Relaxed) };
            if f & RETIRE_PENDING != 0 {
                out.push(ptr);
            }
        }
        out
    }
}
