//! Eviction: the pass over the eviction index and the unlink of one leaf.

use super::node::NO_PAGE_ID;
use super::*;
use crate::events::Pending;
use crate::sync::epoch::Shared;
use node::Without;

impl RadixTree {
    /// Frees at least `k` tokens (fewer only if nothing more is evictable), taking
    /// unpinned leaves in policy order (smallest key first: LRU takes the least recently
    /// accessed; see [`EvictionPolicy`] and `docs/eviction.md` for the others). A whole leaf
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
        let mut pass = self.pass();
        let mut since_repin = 0;
        loop {
            let next = pass.freed < k;
            let popped = self.index.pop_after(pass.done.take(), next, &pass.guard);
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
                self.index.pop_after(pass.done.take(), false, &pass.guard);
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
    /// publish the parent's table without `x`, mark the parent `DEAD` if it is a root left
    /// without children, unlock, reclaim that root (see the `namespace` module), and read
    /// the parent's state for the unpin/evict pair (see `try_unpin`).
    pub(super) fn evict_leaf(&self, x: &Node, g: &Guard) -> Option<(usize, *const Node)> {
        let x_ptr = x as *const Node as *mut Node;
        // KV events (one field read; nothing else with events off): the leaf's removal names
        // its pages by id (hashed when the batch is resolved: `crate::events::resolve`), and
        // is dropped if the CAS fails.
        let mut removed = self.events.as_deref().filter(|_| x.page_id != NO_PAGE_ID).map(|s| {
            let pages = (x.len() / self.cfg.page_size) as u32;
            (s, Pending::Removed { first: x.page_id, pages })
        });
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
            // The word may carry SWA_GONE (an SWA tombstone leaf), never an SWA pin without a
            // pin: any other bit fails it.
            let mut s = x.state.load(Ordering::Relaxed);
            loop {
                if s & (PIN_MASK | DEAD | REPLACED) != 0 {
                    return None; // pinned, or replaced or evicted before we locked it
                }
                match x.state.compare_exchange(s, s | DEAD, Ordering::AcqRel, Ordering::Relaxed) {
                    Ok(_) => break,
                    Err(v) => s = v, // a tombstone landed meanwhile
                }
            }
            // KV events: the leaf's `BlockRemoved` is pushed here, after the CAS (the
            // commit: a racing pin landed first, and then nothing is pushed, or fails after)
            // and before the parent's lock is released. So a re-insert of the same page,
            // which hangs its leaf under this parent under this lock only once `x` is
            // unlinked (`hang` re-checks `cur.child(page)` under the lock and looks again
            // while the DEAD `x` is there), pushes its new store after this removal; an
            // insert below `x` needed `x`'s lock and `x` live, so none pushed after this; and
            // the parent is queued only after we return, so its removal comes after ours.
            if let Some((sink, ev)) = removed.take() {
                sink.push_pending(ev);
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
            // A root left without children dies here, still under its lock (step (1) of the
            // reclaim, see the `namespace` module): an insert into it either hung its leaf
            // before this lock (and the root was not childless) or sees DEAD after it.
            // AcqRel: as in `try_reclaim_root`. It cannot fail: a live root's state is 0
            // (roots are never pinned or split) and DEAD is set only under this lock.
            let root_died = is_root
                && parent_now_leaf
                && parent
                    .state
                    .compare_exchange(0, DEAD, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok();
            drop(xl);
            drop(pl);
            if self.swa.is_some() {
                // Out of the SWA index before it is retired (`swa.rs`); its SWA KV goes with
                // it unless it was a tombstone. Relaxed: statistics.
                self.swa_cut(x);
                if s & super::node::SWA_GONE == 0 {
                    self.swa_cached.fetch_sub(x.len() as u64, Ordering::Relaxed);
                }
            }
            if root_died {
                self.reclaim_dead_root(parent, g);
            }
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

    /// Evicts every unpinned page of namespace `ns` (a tenant offboarded, a LoRA adapter
    /// unloaded), whatever the eviction order; pinned pages (and the pages on the path to
    /// them) stay until their locks are released, and then compete for eviction as usual.
    /// Every freed slot is handed to `free` exactly once, as in [`RadixTree::evict`].
    /// Returns the tokens freed: 0 for a namespace with nothing cached, or never seen (not
    /// an error). Once nothing of it is left, the namespace itself is reclaimed.
    ///
    /// It is a sequence of leaf evictions, each linearizable as in `evict`, not one atomic
    /// step: pages inserted into `ns` while it runs may stay, and so may an edge a racing
    /// `match_and_lock` splits (it looks again, a few rounds at most). O(nodes of `ns`) plus
    /// O(log n) per evicted leaf.
    pub fn drop_namespace(&self, ns: u64, free: &mut dyn FnMut(&[u32])) -> usize {
        let mut scratch = Vec::new();
        self.drop_namespace_with(ns, &mut |x| x.edge.with_slots(&mut scratch, |s| free(s)))
    }

    /// [`RadixTree::drop_namespace`], handing each evicted leaf's slots to `free` as runs
    /// (as [`RadixTree::evict_runs`] does).
    pub fn drop_namespace_runs(&self, ns: u64, free: &mut dyn FnMut(&[SlotRun])) -> usize {
        let mut runs = Vec::new();
        self.drop_namespace_with(ns, &mut |x| {
            runs.clear();
            x.edge.push_runs(&mut runs, x.len());
            free(&runs)
        })
    }

    /// The walk behind `drop_namespace`: per round, list the namespace's nodes children
    /// first (under the pass's guard), then evict each that is an unpinned leaf by then, as
    /// the eviction pass does (`evict_leaf`, then one index step that retires it and queues
    /// its parent); a node the round could not take because a split replaced it meanwhile
    /// calls for another round (at most [`DROP_ROUNDS`]).
    pub(super) fn drop_namespace_with(&self, ns: u64, hand: &mut dyn FnMut(&Node)) -> usize {
        let mut pass = self.pass();
        for _ in 0..DROP_ROUNDS {
            let Some(root) = self.root(ns, &pass.guard) else { break };
            // Children before parents: a parent is a leaf by the time the walk reaches it,
            // if the round took all of its children.
            let mut order: Vec<&Node> = Vec::new();
            let mut stack = vec![(root, false)];
            while let Some((n, expanded)) = stack.pop() {
                if expanded {
                    order.push(n);
                    continue;
                }
                if !std::ptr::eq(n, root) {
                    stack.push((n, true));
                }
                if let Some(t) = n.table(&pass.guard) {
                    for c in t.nodes() {
                        // SAFETY: read from a table loaded under the guard (node_ref).
                        let c = unsafe { node_ref(c, &pass.guard) }.expect("tables hold no null");
                        stack.push((c, false));
                    }
                }
            }
            let mut replaced = false;
            for x in order {
                // Retire the leaf taken last and queue its parent (one index step).
                if pass.done.is_some() {
                    self.index.pop_after(pass.done.take(), false, &pass.guard);
                }
                // `x` was reachable through tables after the guard was pinned, which is what
                // `evict_leaf` needs (as for a node popped from the index).
                match self.evict_leaf(x, &pass.guard) {
                    Some((len, parent)) => {
                        pass.freed += len;
                        pass.leaves += 1;
                        pass.done = Some(Evicted { node: x as *const Node as *mut Node, parent });
                        hand(x);
                    }
                    // Acquire: pairs with the split's Release CAS.
                    None => replaced |= x.state.load(Ordering::Acquire) & REPLACED != 0,
                }
            }
            if !replaced {
                break;
            }
        }
        pass.freed
    }

    /// A new eviction call's state.
    pub(super) fn pass(&self) -> Pass<'_> {
        Pass { tree: self, guard: self.domain.pin(), done: None, freed: 0, leaves: 0 }
    }
}

/// Rounds of [`RadixTree::drop_namespace`] at most (another one only when a racing split
/// replaced a node the round meant to take).
const DROP_ROUNDS: usize = 4;

/// One eviction call's state: its guard, the leaf evicted last (retired by the next index
/// step, or by the drop), and the counters it moves when it ends (see `evict_with`).
pub(super) struct Pass<'a> {
    tree: &'a RadixTree,
    pub(super) guard: Guard,
    pub(super) done: Option<Evicted>,
    pub(super) freed: usize,
    pub(super) leaves: u64,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        // Also on unwind (a panicking `hand`): the pending leaf is unlinked and its slots
        // were handed over, so retire it and queue its parent, then count every leaf out.
        if let Some(d) = self.done.take() {
            self.tree.index.pop_after(Some(d), false, &self.guard);
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
