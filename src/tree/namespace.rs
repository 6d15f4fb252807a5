//! Namespaces: each has its own root, found through an immutable sorted table that is
//! replaced whole (under `roots_lock`) when a namespace appears.

use super::*;
use slots::Edge;

/// Namespace -> root, an immutable sorted table replaced whole when a namespace appears.
pub(super) struct NsTable {
    pub(super) ids: Box<[u64]>,
    pub(super) roots: Box<[*mut Node]>,
}

// SAFETY: immutable once published; roots are nodes, which are Send + Sync.
unsafe impl Send for NsTable {}
// SAFETY: as above.
unsafe impl Sync for NsTable {}

impl RadixTree {
    pub(super) fn root<'g>(&self, ns: u64, g: &'g Guard) -> Option<&'g Node> {
        // Acquire: pairs with the Release store that published the table (and new roots).
        let t = self.roots.load(Ordering::Acquire, g);
        // SAFETY: namespace tables are retired through the epoch only after being swapped
        // out, so one loaded under `g` is valid for 'g.
        let t = unsafe { t.as_ref() }?;
        let i = t.ids.binary_search(&ns).ok()?;
        // SAFETY: roots live as long as the tree.
        unsafe { node_ref(t.roots[i], g) }
    }

    pub(super) fn root_or_create<'g>(&self, ns: u64, g: &'g Guard) -> &'g Node {
        if let Some(r) = self.root(ns, g) {
            return r;
        }
        let _l = lock(&self.roots_lock);
        if let Some(r) = self.root(ns, g) {
            return r;
        }
        let root = Box::into_raw(Box::new(Node::new(Edge::new(&[], &[], 1), 0, 0)));
        // Relaxed: under the roots lock this is the current table, ordered by the lock.
        let old = self.roots.load(Ordering::Relaxed, g);
        // SAFETY: as in `root`.
        let (mut ids, mut roots) = match unsafe { old.as_ref() } {
            Some(t) => (t.ids.to_vec(), t.roots.to_vec()),
            None => (Vec::new(), Vec::new()),
        };
        let i = ids.partition_point(|&x| x < ns);
        ids.insert(i, ns);
        roots.insert(i, root);
        let new = Owned::new(NsTable { ids: ids.into(), roots: roots.into() });
        // Release: publishes the table and the new root to readers that Acquire-load it.
        self.roots.store(new, Ordering::Release);
        if !old.is_null() {
            // SAFETY: `old` was just swapped out under the roots lock; no new reader can
            // load it, and current readers hold guards the epoch waits for.
            unsafe { g.defer_destroy(old) };
        }
        // SAFETY: roots live as long as the tree.
        unsafe { node_ref(root, g) }.expect("fresh root")
    }
}
