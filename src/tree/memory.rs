//! What the index itself holds in memory: a walk of the reachable structure.

use super::*;

impl RadixTree {
    /// An estimate of the heap bytes the index holds: every reachable node (its `Node`
    /// struct and its edge's token and slot storage, in whatever compact form the slots
    /// take), every child table, the namespace map with its roots, and the eviction
    /// index (its queue's capacity and one ticket per queued entry, counted at 16 bytes
    /// where 8 are asked for). Apart from the tickets' rounding it is the sum of the sizes
    /// the tree asks the allocator for, so it leaves out the allocator's own
    /// per-allocation overhead, the fixed-size [`RadixTree`] struct itself, and nodes and
    /// tables that were unlinked but not yet freed by the epoch (see
    /// [`RadixTree::reclaim`]). `tests/index_memory.rs` checks it against a counting
    /// allocator (within 1%).
    ///
    /// Computed by walking the tree: O(nodes), no lock held except the eviction index's
    /// mutex for a moment. Exact at quiescence; under concurrent writers it is the size of
    /// a mix of recent states (never a crash: the walk holds an epoch guard).
    pub fn memory_bytes(&self) -> usize {
        let g = self.domain.pin();
        let mut bytes = self.index.heap_bytes();
        bytes += self.roots.heap_bytes(&g);
        let mut stack = Vec::new();
        self.roots.for_each(&g, &mut |r| {
            // SAFETY: a root read from the map under `g` is valid while `g` lives (see the
            // `namespace` module).
            if let Some(root) = unsafe { r.as_ref() } {
                bytes += std::mem::size_of::<Root>() - std::mem::size_of::<Node>();
                stack.push(&root.node);
            }
        });
        // Acquire (every load of the walk): it dereferences what it loads, as a match does.
        while let Some(n) = stack.pop() {
            bytes += n.heap_bytes();
            let Some(table) = n.table(&g) else { continue };
            bytes += table.heap_bytes();
            for c in table.nodes() {
                // SAFETY: reachable from a table loaded under `g`, so not yet freed.
                if let Some(c) = unsafe { node_ref(c, &g) } {
                    stack.push(c);
                }
            }
        }
        bytes
    }
}
