//! Copy-on-split: replacing an edge by its two halves under one atomic store.

use super::*;
use slots::Edge;

impl RadixTree {
    /// Splits `a` after its first `k` tokens (copy-on-split, see the module docs) and
    /// returns the upper half U, pinned once more than A was when `pin_u`. `None` if `a`
    /// was replaced or evicted meanwhile (the caller looks again).
    pub(super) fn split<'g>(
        &self,
        a: &'g Node,
        k: usize,
        pin_u: bool,
        g: &'g Guard,
    ) -> Option<&'g Node> {
        debug_assert!(k > 0 && k < a.len() && k % self.cfg.page_size == 0);
        let a_ptr = a as *const Node as *mut Node;
        loop {
            let pp = a.parent.load(Ordering::SeqCst);
            // SAFETY: `a` was reachable under `g`, so its parent then was too, and parents
            // are retired only after their children's parent pointers moved on.
            let parent = unsafe { node_ref(pp, g) }.expect("non-root nodes have a parent");
            let _pl = lock(&parent.lock);
            let _al = lock(&a.lock);
            let s0 = a.state.load(Ordering::SeqCst);
            if s0 & (DEAD | REPLACED) != 0 {
                return None;
            }
            if a.parent.load(Ordering::SeqCst) != pp {
                continue; // the parent was split; A now hangs under its L
            }
            debug_assert_eq!(parent.state.load(Ordering::SeqCst) & (DEAD | REPLACED), 0);
            // (1) Build U and L off to the side.
            let stamp = a.stamp.load(Ordering::Relaxed);
            let u = Box::into_raw(Box::new(Node::new(Edge::part_of(&a.edge, 0, k), 0, stamp)));
            let l =
                Box::into_raw(Box::new(Node::new(Edge::part_of(&a.edge, k, a.len()), 0, stamp)));
            // SAFETY: both were just allocated and are not shared yet.
            let (un, ln) = unsafe { (&*u, &*l) };
            // L stays locked until its children point at it: from the moment U is published
            // a thread may reach L and want to change L's table or split L, and it must not
            // do so while a child of L still names A (or a child names L while L is being
            // replaced). Uncontended: nobody else can see L yet.
            let _ll = lock(&ln.lock);
            un.parent.store(pp, Ordering::SeqCst);
            ln.parent.store(u, Ordering::SeqCst);
            // A is locked, so its table cannot change: L takes it over as is.
            ln.children.store(a.children.load(Ordering::SeqCst, g), Ordering::SeqCst);
            un.children.store(Owned::new(ChildTable::single(ln.key()[0], l)), Ordering::SeqCst);
            // (2) Freeze A's pin count into U and L.
            a.forward.store(u, Ordering::SeqCst);
            let mut v = s0;
            loop {
                un.state.store(v + pin_u as u64, Ordering::SeqCst);
                ln.state.store(v, Ordering::SeqCst);
                match a.state.compare_exchange(v, v | REPLACED, Ordering::SeqCst, Ordering::SeqCst)
                {
                    Ok(_) => break,
                    Err(x) => {
                        debug_assert_eq!(x & (DEAD | REPLACED), 0, "A is locked");
                        v = x;
                    }
                }
            }
            if pin_u && v & PIN_MASK == 0 {
                self.on_pinned(k);
            }
            // (3) Publish U in place of A: one atomic store.
            let old = parent.children.load(Ordering::SeqCst, g);
            // SAFETY: the parent is locked, so its table is the current one and not retired.
            let table = unsafe { old.deref() }.with_replaced(a_ptr, u);
            parent.children.store(Owned::new(table), Ordering::SeqCst);
            // SAFETY: swapped out under the parent's lock; readers hold guards.
            unsafe { g.defer_destroy(old) };
            // (4) Re-parent A's children (under A's and L's locks, so their tables and
            // these pointers cannot change meanwhile), queue L, retire A.
            if let Some(t) = ln.table(g) {
                for c in t.nodes() {
                    // SAFETY: children of the locked L (A's table) are live nodes.
                    let c = unsafe { node_ref(c, g) }.expect("tables hold no null");
                    c.parent.store(l, Ordering::SeqCst);
                }
            }
            self.nodes.fetch_add(1, Ordering::Relaxed);
            if v & PIN_MASK == 0 && ln.is_leaf(g) {
                self.index.push(ln);
            }
            drop(_ll);
            drop(_al);
            drop(_pl);
            self.index.retire(a_ptr, g);
            return Some(un);
        }
    }
}
