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
        debug_assert!(k > 0 && k < a.len() && k.is_multiple_of(self.cfg.page_size));
        let a_ptr = a as *const Node as *mut Node;
        loop {
            // Acquire: the parent named was built before the Release store of this pointer.
            let pp = a.parent.load(Ordering::Acquire);
            // SAFETY: `a` was reachable after `g` was pinned (the caller reached it through
            // tables under `g`), and a parent is retired only after every store that removes
            // a pointer to it from a child (re-parenting in its own split; an evicted parent
            // has no children left): a pointer read under `g` names a node valid for `g`.
            let parent = unsafe { node_ref(pp, g) }.expect("non-root nodes have a parent");
            let _pl = lock(&parent.lock);
            let _al = lock(&a.lock);
            // Relaxed: DEAD and REPLACED are set only under A's lock, which we hold; the pin
            // count may move, and the CAS in (2) re-reads it.
            let s0 = a.state.load(Ordering::Relaxed);
            if s0 & (DEAD | REPLACED) != 0 {
                return None;
            }
            // Relaxed: `a.parent` changes only under its current parent's lock; holding
            // pp's lock, we read the latest value if it is still pp.
            if a.parent.load(Ordering::Relaxed) != pp {
                continue; // the parent was split; A now hangs under its L
            }
            // Relaxed: the bits are set under the parent's lock, which we hold.
            debug_assert_eq!(parent.state.load(Ordering::Relaxed) & (DEAD | REPLACED), 0);
            // (1) Build U and L off to the side. Both inherit A's stamp and metadata
            // (priority and hit count, as SGLang's `_split_node` gives its new node the
            // child's); bumps of A that land after this read reach them in (2').
            // Relaxed (both): eviction-order hints. A's word is not frozen: only a split of
            // A freezes it, under A's lock, after setting REPLACED (checked above).
            let stamp = a.stamp.load(Ordering::Relaxed);
            let m0 = a.meta.load(Ordering::Relaxed);
            debug_assert_eq!(m0 & FROZEN, 0);
            let mut ub = Box::new(Node::new(Edge::part_of(&a.edge, 0, k), 0, stamp, m0));
            let mut lb = Box::new(Node::new(Edge::part_of(&a.edge, k, a.len()), 0, stamp, m0));
            // KV events: a split publishes nothing (no page changes); the halves keep A's
            // page ids (U the first, L those from its page `k / page_size`), so every page
            // keeps the id its store named (`crate::events::resolve`).
            ub.start = a.start;
            // Relaxed: an eviction-order hint, as the stamp.
            let swa_stamp = a.swa_stamp.load(Ordering::Relaxed);
            ub.swa_stamp = AtomicU64::new(swa_stamp);
            lb.swa_stamp = AtomicU64::new(swa_stamp);
            lb.start = a.start + k as u32;
            if a.page_id != super::node::NO_PAGE_ID {
                ub.page_id = a.page_id;
                lb.page_id = a.page_id + (k / self.cfg.page_size) as u64;
            }
            let u = Box::into_raw(ub);
            let l = Box::into_raw(lb);
            // SAFETY: both were just allocated and are not shared yet.
            let (un, ln) = unsafe { (&*u, &*l) };
            // L stays locked until its children point at it: from the moment U is published
            // a thread may reach L and want to change L's table or split L, and it must not
            // do so while a child of L still names A (or a child names L while L is being
            // replaced). Uncontended: nobody else can see L yet.
            let _ll = lock(&ln.lock);
            // Relaxed (all of U's and L's fields until (3)): they are not shared yet; the
            // Release CAS in (2) publishes them to readers that follow `forward`, and the
            // Release store in (3) to readers that load the parent's table.
            un.parent.store(pp, Ordering::Relaxed);
            ln.parent.store(u, Ordering::Relaxed);
            // A is locked, so its table cannot change: L takes it over as is (Relaxed: the
            // pointer is only moved, and A's lock orders the table's content).
            ln.children.store(a.children.load(Ordering::Relaxed, g), Ordering::Relaxed);
            un.children.store(Owned::new(ChildTable::single(ln.key()[0], l)), Ordering::Relaxed);
            // (2) Freeze A's pin count into U and L.
            // Relaxed: published by the Release CAS below, before which no reader follows it.
            a.forward.store(u, Ordering::Relaxed);
            let mut v = s0;
            loop {
                un.state.store(v + pin_u as u64, Ordering::Relaxed);
                ln.state.store(v, Ordering::Relaxed);
                // AcqRel: Release publishes `forward`, U and L to readers that see REPLACED
                // (Acquire, `resolve`); Acquire takes over the Release of the pins and unpins
                // whose count U and L inherit. Relaxed on failure: we retry with the value.
                match a.state.compare_exchange(v, v | REPLACED, Ordering::AcqRel, Ordering::Relaxed)
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
            // (2') Freeze A's metadata word (policies that keep one): from this RMW on, a
            // bump of A fails and goes to the nodes that now hold A's tokens (`Insert::bump`
            // walks to them; they are reachable through `forward`, REPLACED being set), and
            // what bumps landed on A since (1) goes to U and L here: each bump counts once.
            // AcqRel: Release so that a bump whose CAS reads FROZEN (Acquire) sees REPLACED
            // and `forward`; the RMW reads A's last bump whatever its ordering.
            if self.cfg.policy.reads_meta() {
                let m1 = a.meta.fetch_or(FROZEN, Ordering::AcqRel);
                if m1 != m0 {
                    let hits = policy::meta_hits(m1).saturating_sub(policy::meta_hits(m0));
                    let prio = policy::meta_priority(m1);
                    // Cannot fail: only a split freezes a word, and neither half can be split
                    // while we hold A's parent's lock (U's parent) and L's lock.
                    let ok = self.try_bump(un, prio, hits) && self.try_bump(ln, prio, hits);
                    debug_assert!(ok, "a half of a split in progress is frozen");
                }
            }
            // (3) Publish U in place of A: one atomic store.
            // Relaxed: the parent is locked, so this is its current table, and its content
            // was published to us by the lock.
            let old = parent.children.load(Ordering::Relaxed, g);
            // SAFETY: the parent is locked, so its table is the current one and not retired
            // (tables are retired only when swapped out, under this lock).
            let table = unsafe { old.deref() }.with_replaced(a_ptr, u);
            // Release: publishes U, L and the new table to readers that Acquire-load it.
            parent.children.store(Owned::new(table), Ordering::Release);
            // SAFETY: swapped out under the parent's lock, so no thread pinned from now on
            // can load it; the epoch frees it after every guard that could have is gone.
            unsafe { g.defer_destroy(old) };
            // (4) Re-parent A's children (under A's and L's locks, so their tables and
            // these pointers cannot change meanwhile), queue L, retire A.
            if let Some(t) = ln.table(g) {
                for c in t.nodes() {
                    // SAFETY: the children of the locked L (A's table) are linked: unlinking
                    // one needs L's (or A's) lock, held here.
                    let c = unsafe { node_ref(c, g) }.expect("tables hold no null");
                    // Release: a writer that Acquire-loads this pointer then locks L.
                    c.parent.store(l, Ordering::Release);
                }
            }
            // Relaxed: statistics.
            self.nodes.fetch_add(1, Ordering::Relaxed);
            if v & PIN_MASK == 0 && ln.is_leaf(g) {
                self.index.push(ln);
            }
            drop(_ll);
            drop(_al);
            drop(_pl);
            // With a window: the halves are SWA candidates if A was (they carry its word,
            // SWA pins and SWA_GONE included), and A leaves the SWA index before it is
            // retired (`swa.rs`).
            if self.swa.is_some() {
                if v & (super::node::SWA_GONE | super::node::SWA_PIN_MASK) == 0 {
                    self.swa_push(un);
                    self.swa_push(ln);
                }
                self.swa_cut(a);
            }
            // A is retired after the locks are dropped, so U may be split or evicted (and
            // retired) before A is: see the descent module on following `forward`.
            self.index.retire(a_ptr, g);
            return Some(un);
        }
    }
}
