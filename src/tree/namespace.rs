//! Namespaces: each has its own root, found through the namespace map (`ns_map.rs`), and
//! a namespace whose last page goes is reclaimed: its root is unlinked from the map and
//! retired through the epoch.
//!
//! # Root lifetime (the reclaim protocol)
//!
//! A root is a [`Root`]: a node of length 0 (no other edge is that short) that also knows
//! its namespace id. It is never pinned, split or queued for eviction, so its state word is
//! 0 until it dies and then `DEAD`; `DEAD` is set only under the root's own lock, from
//! exactly 0, and only while the root has no children. A root, once `DEAD`, never gets a
//! child again (an insert hangs a leaf only under a locked, live node: `Insert::hang`), so
//! a dead root stands for an empty namespace from that moment on.
//!
//! Publish order (creation, `root_or_create`): build the root, then, under the shard's
//! lock, one Release store puts it in the map (a new entry, or the entry whose root is
//! dead). Two creators of one namespace serialize on the shard lock and re-check there: the
//! second finds the first's live root and uses it.
//!
//! Retire order (reclaim, `reclaim_dead_root`): (1) under the root's lock, with the root
//! childless, CAS its state `0 -> DEAD` (the eviction of its last child does this while it
//! still holds the root's lock, `evict_leaf`; an insert that created a root and then failed
//! does it in `try_reclaim_root`); (2) unlock; under the shard lock, remove the map's entry
//! if it still names this root (a creator may have put a new root there already: then
//! there is nothing to remove); (3) retire the root through the epoch. Whoever wins the CAS
//! in (1) does (2) and (3), once.
//!
//! Why an insert never lands in an unlinked root: it hangs its leaf under the root's lock
//! after checking the root is not `DEAD` (`Insert::hang`); the CAS in (1) is made under
//! the same lock with the root childless. So either the insert's leaf is published first
//! (the root has a child, the CAS is not made, the namespace stays), or the CAS comes
//! first and the insert sees `DEAD`, looks the namespace up again and creates it afresh
//! (`root_or_create` treats a dead root as absent). A lookup that reads a dead root (it
//! may: the map still names it until (2), and a reader on a table a shard grew out of
//! still names it later) sees an empty namespace, which it was from the CAS on; a pinned
//! page keeps its root alive (the root has a child), so `release` always finds the root
//! its pins hang under.
//!
//! Memory: a root loaded from the map under a guard was in the map at a moment after the
//! guard was pinned and is retired only after (2), so the epoch keeps it for that guard; a
//! node's `parent` pointer may name a root too, and the root is retired only after its last
//! child was unlinked (a pointer read from a node reachable after the guard was pinned).
//! Lock order: the shard lock is never held with a node lock or the eviction index's lock.

use super::*;
use crate::sync::epoch::Shared;
use slots::Edge;

/// A namespace's root: a node of length 0 and the namespace it is the root of.
///
/// `repr(C)` with the node first, so a `&Node` of length 0 (always a root's) converts back
/// to its `Root` ([`Root::of`]).
#[repr(C)]
pub(crate) struct Root {
    pub(crate) node: Node,
    pub(crate) ns: u64,
}

impl Root {
    fn new(ns: u64) -> Root {
        Root { node: Node::new(Edge::new(&[], &[], 1), 0, 0, 0), ns }
    }

    /// The `Root` a root node is the first field of.
    ///
    /// # Safety
    /// `n` must be a root node (`n.len() == 0`: every other edge is at least a page long,
    /// and roots are allocated only as `Root`s, by `root_or_create`).
    pub(crate) unsafe fn of(n: &Node) -> &Root {
        debug_assert_eq!(n.len(), 0, "only a root has length 0");
        // SAFETY: `Root` is repr(C) with the node first, and the caller guarantees `n` is
        // the `node` of a `Root` allocation; the reference keeps `n`'s lifetime.
        unsafe { &*(n as *const Node).cast::<Root>() }
    }
}

/// Counts of one namespace (see [`RadixTree::namespace_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NamespaceStats {
    /// Tokens cached in the namespace.
    pub cached_tokens: u64,
    /// Cached and not pinned.
    pub evictable_tokens: u64,
    /// Cached and pinned.
    pub protected_tokens: u64,
    /// Nodes (edges), the root excluded.
    pub nodes: u64,
}

impl RadixTree {
    /// The root of `ns`, if the map names one. It may be dead (then the namespace is empty,
    /// see the module docs). Lock-free.
    #[inline]
    pub(super) fn root<'g>(&self, ns: u64, g: &'g Guard) -> Option<&'g Node> {
        let r = self.roots.get(ns, g);
        // SAFETY: a root read from the map under `g` is valid for 'g (see the module docs).
        unsafe { r.as_ref() }.map(|r| &r.node)
    }

    /// The live root of `ns`, created if there is none (or only a dead one).
    pub(super) fn root_or_create<'g>(&self, ns: u64, g: &'g Guard) -> &'g Node {
        if let Some(r) = self.root(ns, g) {
            // Acquire: pairs with the reclaim's AcqRel CAS that set DEAD.
            if r.state.load(Ordering::Acquire) & DEAD == 0 {
                return r;
            }
        }
        let mut w = self.roots.write(ns, g);
        // SAFETY: as in `root` (read under the shard lock, which orders it).
        if let Some(r) = unsafe { w.get().as_ref() } {
            // Acquire: as above (DEAD is set under the root's lock, not this one).
            if r.node.state.load(Ordering::Acquire) & DEAD == 0 {
                return &r.node; // another creator came first
            }
        }
        let root = Box::into_raw(Box::new(Root::new(ns)));
        // The root replaced, if any, is dead: its reclaimer retires it (its entry no longer
        // names it, so the reclaimer's removal finds nothing to remove).
        w.set(root);
        drop(w);
        // Relaxed: a statistic, exact at quiescence.
        self.namespaces.fetch_add(1, Ordering::Relaxed);
        // SAFETY: just published in the map, after `g` was pinned: valid for 'g.
        unsafe { &(*root).node }
    }

    /// Steps (2) and (3) of the reclaim (see the module docs), for the caller that won the
    /// CAS of `root`'s state to `DEAD`: unlinks it from the map (if the map still names
    /// it) and retires it. Holds no node lock.
    pub(super) fn reclaim_dead_root(&self, root: &Node, g: &Guard) {
        // SAFETY: only roots are passed here (length 0).
        let r = unsafe { Root::of(root) };
        let ptr = r as *const Root as *mut Root;
        self.roots.write(r.ns, g).remove_if(ptr);
        // Relaxed: a statistic, exact at quiescence.
        self.namespaces.fetch_sub(1, Ordering::Relaxed);
        // KV events (not built yet): "namespace r.ns removed" is published here.
        // SAFETY: out of the map (removed above, or replaced by a creator before), childless
        // and dead, so no thread pinned from now on can reach it; threads pinned before
        // hold guards the epoch waits for (see the module docs). Never queued for eviction
        // (roots never are), so it has no ticket to cut.
        unsafe { g.defer_destroy(Shared::from(ptr.cast_const())) };
    }

    /// Reclaims `root` if it is a live root without children (step (1) under its lock, then
    /// [`RadixTree::reclaim_dead_root`]); for an insert that created a root and then failed.
    pub(super) fn try_reclaim_root(&self, root: &Node, g: &Guard) {
        let l = lock(&root.lock);
        // The caller saw the root childless before this lock; a racing insert may have hung
        // the namespace's first page since (its `hang` holds this lock and found the root
        // live). Only a root still childless under the lock may die, as in `evict_leaf`
        // (loom: `refused_insert_reclaiming_a_root_racing_an_insert_into_it`, mutant N7).
        if !root.is_leaf(g) {
            return;
        }
        // AcqRel: Release orders the root's emptiness before a reader that sees DEAD;
        // Acquire pairs with the store of the last table (under this lock anyway). Relaxed
        // on failure: dead already (someone else reclaims it).
        if root.state.compare_exchange(0, DEAD, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return;
        }
        drop(l);
        self.reclaim_dead_root(root, g);
    }

    /// Live namespaces: those with at least one cached page, as counted now (exact at
    /// quiescence; an insert that is creating a namespace counts it from the moment its
    /// root is in the map).
    pub fn namespace_count(&self) -> u64 {
        // Relaxed: a statistic.
        (self.namespaces.load(Ordering::Relaxed) as i64).max(0) as u64
    }

    /// Counts of one namespace: its cached, evictable and protected tokens and its nodes
    /// (all 0 for a namespace that has nothing cached, or was never seen). Walks the
    /// namespace's nodes (O(its nodes), lock-free, writes nothing): exact at quiescence,
    /// under concurrency a mix of moments, as [`RadixTree::stats`] is.
    pub fn namespace_stats(&self, ns: u64) -> NamespaceStats {
        let g = self.domain.pin();
        let mut st = NamespaceStats::default();
        let Some(root) = self.root(ns, &g) else { return st };
        let mut stack = vec![root];
        while let Some(n) = stack.pop() {
            let Some(t) = n.table(&g) else { continue };
            for c in t.nodes() {
                // SAFETY: read from a table loaded under `g` (node_ref's contract).
                let c = unsafe { node_ref(c, &g) }.expect("tables hold no null");
                // Acquire: pairs with the pins' and the eviction's Release RMWs.
                let s = c.state.load(Ordering::Acquire);
                if s & DEAD != 0 {
                    continue; // being evicted: gone
                }
                let len = c.len() as u64;
                st.nodes += 1;
                st.cached_tokens += len;
                if s & PIN_MASK != 0 {
                    st.protected_tokens += len;
                } else {
                    st.evictable_tokens += len;
                }
                stack.push(c);
            }
        }
        st
    }
}
