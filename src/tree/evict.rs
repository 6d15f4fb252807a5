//! Eviction: the pass over the eviction index and the unlink of one leaf.

use super::*;
use crate::sync::epoch::Shared;
use node::Without;

impl RadixTree {
    /// Frees at least `k` tokens (fewer only if nothing more is evictable), taking
    /// unpinned leaves in policy order (LRU: least recently accessed first). A whole leaf
    /// edge goes at once, so it may free more than `k`. Every freed slot is handed to
    /// `free` exactly once (called with no tree lock held; it must not call back into the
    /// tree). Returns the tokens freed. O(log n) per evicted leaf, plus O(tokens) to list
    /// the slots ([`RadixTree::evict_runs`] hands them over as runs instead).
    pub fn evict(&self, k: usize, free: &mut dyn FnMut(&[u32])) -> usize {
        // Expanded slots of compactly stored leaves, reused across the call's leaves.
        let mut scratch = Vec::new();
        self.evict_with(k, &mut |x| x.edge.with_slots(&mut scratch, |slots| free(slots)))
    }

    /// [`RadixTree::evict`], handing each evicted leaf's slots to `free` as runs of
    /// consecutive slots ([`SlotRun`]; one run for a leaf whose slots run consecutively,
    /// as a pool hands them out) rather than one by one: the cost per leaf no longer grows
    /// with its length when its slots come in runs. Runs of one call are not merged across
    /// leaves; together they name every freed slot exactly once.
    pub fn evict_runs(&self, k: usize, free: &mut dyn FnMut(&[SlotRun])) -> usize {
        let mut runs = Vec::new();
        self.evict_with(k, &mut |x| {
            runs.clear();
            x.edge.push_runs(&mut runs, x.len());
            free(&runs)
        })
    }

    /// The eviction loop: `hand` gets each evicted leaf, unlinked and not yet retired, to
    /// hand its slots over.
    ///
    /// Per leaf it takes the index lock once ([`EvictIndex::pop_after`] retires the leaf
    /// evicted before, queues its parent if that became a leaf, and pops the next), and the
    /// shared counters move once per call, not per leaf: locked instructions are most of
    /// what a leaf costs.
    ///
    /// Unwind-safe: a leaf is recorded as pending before `hand` sees it, and the pass's
    /// drop retires the pending leaf, queues its parent and moves the counters, so a `hand`
    /// that panics leaks no node and leaves the counters exact (its slots were handed to it).
    pub(super) fn evict_with(&self, k: usize, hand: &mut dyn FnMut(&Node)) -> usize {
        let mut pass = Pass {
            tree: self,
            lru: self.cfg.policy == EvictionPolicy::Lru,
            guard: self.domain.pin(),
            done: None,
            freed: 0,
            leaves: 0,
        };
        let mut since_repin = 0;
        loop {
            let next = pass.freed < k;
            let popped = self.index.pop_after(pass.done.take(), next, pass.lru, &pass.guard);
            let Some(x) = popped else {
                break;
            };
            if let Some((len, parent)) = self.evict_leaf(x, &pass.guard) {
                pass.freed += len;
                pass.leaves += 1;
                pass.done = Some(Evicted { node: x as *const Node as *mut Node, parent });
                hand(x);
            }
            since_repin += 1;
            if since_repin == 64 {
                since_repin = 0;
                // Nothing may stay pending across the repin (`done` names nodes by the guard).
                self.index.pop_after(pass.done.take(), false, pass.lru, &pass.guard);
                pass.guard.repin();
            }
        }
        pass.freed
    }

    /// Unlinks `x` if it is still an unpinned leaf; returns its length and the parent to
    /// queue (null if none: still has children, is the root, or is pinned). The caller hands
    /// its slots over (no lock held), retires it and queues the parent
    /// ([`EvictIndex::pop_after`]), and moves the counters. `x` must come from the eviction
    /// index under `g` (live then: `pop_locked` checked it under the index lock).
    ///
    /// Order: lock the parent, re-check that it still is `x`'s parent, lock `x`, re-check
    /// that `x` is a leaf (an insert adds children only under `x`'s lock, after checking `x`
    /// is not `DEAD`), CAS `x`'s state from exactly "0 pins, live" to `DEAD` (a racing pin
    /// lands first or fails), find `x` in the parent's table (loudly: it must be there),
    /// publish the parent's table
    /// without `x`, unlock, and read the parent's state for the unpin/evict pair (see
    /// `try_unpin`).
    pub(super) fn evict_leaf(&self, x: &Node, g: &Guard) -> Option<(usize, *const Node)> {
        let x_ptr = x as *const Node as *mut Node;
        loop {
            // Acquire: as in `split`.
            let pp = x.parent.load(Ordering::Acquire);
            // SAFETY: `x` was live after `g` was pinned (`pop_locked` saw it neither DEAD nor
            // REPLACED under the index lock), so it was linked then; a pointer read from its
            // parent field names a node valid for `g`, as in `split`.
            let parent = unsafe { node_ref(pp, g) }.expect("non-root nodes have a parent");
            let pl = lock(&parent.lock);
            // Relaxed: as in `split` (changes only under the parent's lock, held here).
            if x.parent.load(Ordering::Relaxed) != pp {
                continue; // the parent was split: `x` hangs under its L now
            }
            let xl = lock(&x.lock);
            if !x.is_leaf(g) {
                return None; // an insert hung a child under it meanwhile
            }
            // AcqRel: Acquire reads from the last unpin's Release (the lock holder's use of
            // the slots happens before they are handed out); Release orders the unlink after
            // it for a racing pin, which then fails on DEAD. Relaxed on failure: nothing read.
            if x.state.compare_exchange(0, DEAD, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                return None; // pinned, or replaced or evicted before we locked it
            }
            // Relaxed: the parent is locked: this is its current table, ordered by the lock.
            let old = parent.children.load(Ordering::Relaxed, g);
            // SAFETY: the parent is locked, so `old` is its current table and not retired.
            // A live node (the CAS above found it neither DEAD nor REPLACED) whose parent
            // pointer names the locked parent is in that parent's table: both change only
            // under the parent's lock. A replaced node keeps its parent pointer but is out of
            // the table, which is why the CAS comes first.
            let rest = unsafe { old.deref() }.without(x.key()[0], x_ptr).expect(
                "a live node is in its parent's table while its parent pointer names that \
                 parent (both change only under the parent's lock, held here)",
            );
            let parent_now_leaf = matches!(rest, Without::Empty);
            match rest {
                // Release: publishes the new table to readers that Acquire-load it.
                Without::Rest(t) => parent.children.store(Owned::new(t), Ordering::Release),
                // Release: the table-store half of the unpin/evict pair (see `try_unpin`).
                Without::Empty => parent.children.store(Shared::null(), Ordering::Release),
            }
            // SAFETY: swapped out under the parent's lock, so no thread pinned from now on
            // can load it; the epoch frees it after every guard that could have is gone.
            unsafe { g.defer_destroy(old) };
            let is_root = parent.len() == 0;
            drop(xl);
            drop(pl);
            // The state-read half of the unpin/evict pair: an RMW, so it is ordered with the
            // unpin's CAS in the state word's modification order (see `try_unpin`). AcqRel:
            // Release so an unpin whose CAS reads from it sees the table store above.
            let queue_parent = parent_now_leaf
                && !is_root
                && parent.state.fetch_or(0, Ordering::AcqRel) & (PIN_MASK | DEAD | REPLACED) == 0;
            let parent = if queue_parent { parent as *const Node } else { std::ptr::null() };
            return Some((x.len(), parent));
        }
    }

    /// Drops every unpinned page (everything when nothing is pinned); each freed slot goes
    /// to `free` once. Returns the tokens freed. Counters are cumulative and not cleared.
    pub fn reset(&self, free: &mut dyn FnMut(&[u32])) -> usize {
        self.evict(usize::MAX, free)
    }
}

/// One eviction call's state: its guard, the leaf evicted last (retired by the next index
/// step, or by the drop), and the counters it moves when it ends (see `evict_with`).
struct Pass<'a> {
    tree: &'a RadixTree,
    lru: bool,
    guard: Guard,
    done: Option<Evicted>,
    freed: usize,
    leaves: u64,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        // Also on unwind (a panicking `hand`): the pending leaf is unlinked and its slots
        // were handed over, so retire it and queue its parent, then count every leaf out.
        if let Some(d) = self.done.take() {
            self.tree.index.pop_after(Some(d), false, self.lru, &self.guard);
        }
        let (t, f) = (self.tree, self.freed as u64);
        // Release (pairs with `stats`' Acquire): an allocation that sees this pass's tokens
        // counted out also sees the eviction in progress that `Cache` registered before it,
        // so it waits for its slots instead of failing. The others: statistics (Relaxed).
        t.evictable.fetch_sub(f, Ordering::Release);
        t.cached.fetch_sub(f, Ordering::Relaxed);
        t.nodes.fetch_sub(self.leaves, Ordering::Relaxed);
        t.evicted.fetch_add(f, Ordering::Relaxed);
    }
}
