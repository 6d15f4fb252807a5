//! Eviction: the pass over the eviction index and the unlink of one leaf.

use super::*;

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
    pub(super) fn evict_with(&self, k: usize, hand: &mut dyn FnMut(&Node)) -> usize {
        let lru = self.cfg.policy == EvictionPolicy::Lru;
        // Moves the counters when the call ends, also if `hand` unwinds: every leaf unlinked
        // by then is counted out.
        let mut tally = Tally { tree: self, freed: 0, leaves: 0 };
        let mut g = self.domain.pin();
        let mut since_repin = 0;
        let mut done = None;
        loop {
            let next = tally.freed < k;
            let popped = self.index.pop_after(done.take(), next, lru, &g);
            let Some(x) = popped else {
                break;
            };
            if let Some((len, parent)) = self.evict_leaf(x, &g) {
                tally.freed += len;
                tally.leaves += 1;
                hand(x);
                done = Some(Evicted { node: x as *const Node as *mut Node, parent });
            }
            since_repin += 1;
            if since_repin == 64 {
                since_repin = 0;
                // Nothing may stay pending across the repin (`done` names nodes by the guard).
                self.index.pop_after(done.take(), false, lru, &g);
                g.repin();
            }
        }
        tally.freed
    }

    /// Unlinks `x` if it is still an unpinned leaf; returns its length and the parent to
    /// queue (null if none: still has children, is the root, or is pinned). The caller hands
    /// its slots over (no lock held), retires it and queues the parent
    /// ([`EvictIndex::pop_after`]), and moves the counters.
    pub(super) fn evict_leaf(&self, x: &Node, g: &Guard) -> Option<(usize, *const Node)> {
        let x_ptr = x as *const Node as *mut Node;
        loop {
            let pp = x.parent.load(Ordering::SeqCst);
            // SAFETY: `x` was live after `g` was pinned (checked by `pop`), so the parent
            // it names was linked then and is retired only through the epoch.
            let parent = unsafe { node_ref(pp, g) }.expect("non-root nodes have a parent");
            let pl = lock(&parent.lock);
            if x.parent.load(Ordering::SeqCst) != pp {
                continue;
            }
            let xl = lock(&x.lock);
            if !x.is_leaf(g) {
                return None;
            }
            if x.state.compare_exchange(0, DEAD, Ordering::SeqCst, Ordering::SeqCst).is_err() {
                return None; // pinned, replaced or dead
            }
            let old = parent.children.load(Ordering::SeqCst, g);
            // SAFETY: the parent is locked: `old` is its current table.
            let rest = unsafe { old.deref() }.without(x.key()[0], x_ptr);
            let parent_now_leaf = rest.is_none();
            match rest {
                Some(t) => parent.children.store(Owned::new(t), Ordering::SeqCst),
                None => parent.children.store(crate::sync::epoch::Shared::null(), Ordering::SeqCst),
            }
            // SAFETY: swapped out under the parent's lock; readers hold guards.
            unsafe { g.defer_destroy(old) };
            let is_root = parent.len() == 0;
            drop(xl);
            drop(pl);
            let queue_parent = parent_now_leaf
                && !is_root
                && parent.state.load(Ordering::SeqCst) & (PIN_MASK | DEAD | REPLACED) == 0;
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

/// The counters an eviction call moves, applied once when it ends (see `evict_with`).
struct Tally<'a> {
    tree: &'a RadixTree,
    freed: usize,
    leaves: u64,
}

impl Drop for Tally<'_> {
    fn drop(&mut self) {
        let (t, f) = (self.tree, self.freed as u64);
        t.evictable.fetch_sub(f, Ordering::Relaxed);
        t.cached.fetch_sub(f, Ordering::Relaxed);
        t.nodes.fetch_sub(self.leaves, Ordering::Relaxed);
        t.evicted.fetch_add(f, Ordering::Relaxed);
    }
}
