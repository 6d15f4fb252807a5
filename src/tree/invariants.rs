//! The quiescent walk that checks the tree's structure and counters (for tests).

use super::*;

/// What a quiescent walk of the tree found (see [`RadixTree::check_invariants`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[doc(hidden)] // a test hook: checks, not an engine API (kept public for the tests)
pub struct TreeCensus {
    /// Tokens in reachable nodes.
    pub cached_tokens: u64,
    /// Tokens in reachable nodes with a pin count above zero.
    pub pinned_tokens: u64,
    /// Reachable nodes, roots excluded.
    pub nodes: u64,
    /// Reachable leaves, roots excluded.
    pub leaves: u64,
    /// Heap bytes of nodes (roots included), child tables and the eviction index.
    pub heap_bytes: u64,
    /// Namespaces in the namespace map (each with something cached: an empty one is an
    /// error).
    pub namespaces: u64,
    /// With a sliding window: tokens in reachable nodes that are not SWA tombstones.
    pub swa_cached_tokens: u64,
    /// With a sliding window: tokens in reachable nodes with an SWA pin.
    pub swa_pinned_tokens: u64,
}

impl RadixTree {
    /// Walks the whole tree and checks its structure: every namespace in the map has a live
    /// root with something cached (an empty one was reclaimed), no dead or replaced node reachable,
    /// edges non-empty page multiples, children keyed by distinct first pages in sorted
    /// order, parent pointers right, every unpinned leaf in the eviction index (under `mru`
    /// with its current key), no index entry naming a dead or replaced node, every lazy
    /// entry's key a lower bound of its node's key, and the counters equal to what the walk
    /// finds (`cached == evictable + protected`). Meant for tests at quiescence; concurrent
    /// writers make it report spurious differences.
    #[doc(hidden)] // a test hook: checks, not an engine API (kept public for the tests)
    pub fn check_invariants(&self) -> std::result::Result<TreeCensus, String> {
        let g = self.domain.pin();
        let p = self.cfg.page_size;
        let mut census = TreeCensus::default();
        // Acquire (all loads of this walk): it dereferences what it loads; at quiescence
        // the orderings matter only if a writer was not joined.
        let mut roots = Vec::new();
        self.roots.for_each(&g, &mut |r| roots.push(r));
        census.namespaces = roots.len() as u64;
        for r in roots {
            // SAFETY: a root read from the map under `g` (see the `namespace` module).
            let root = unsafe { r.as_ref() }.map(|r| &r.node).expect("the map holds no null");
            let s = root.state.load(Ordering::Acquire);
            if s != 0 {
                return Err(format!("a root in the map in state {s:#x}"));
            }
            if root.is_leaf(&g) {
                return Err("an empty namespace was not reclaimed".into());
            }
            census.heap_bytes += (std::mem::size_of::<Root>() - std::mem::size_of::<Node>()
                + root.heap_bytes()) as u64;
            let mut stack = vec![root];
            while let Some(n) = stack.pop() {
                let Some(table) = n.table(&g) else { continue };
                census.heap_bytes += table.heap_bytes() as u64;
                let mut prev: Option<&[u32]> = None;
                for c in table.nodes() {
                    // SAFETY: reachable under `g`.
                    let c = unsafe { node_ref(c, &g) }.expect("tables hold no null");
                    let s = c.state.load(Ordering::Acquire);
                    if s & (DEAD | REPLACED) != 0 {
                        return Err(format!("reachable node in state {s:#x}"));
                    }
                    if c.len() == 0 || c.len() % p != 0 {
                        return Err(format!("edge of length {} with page size {p}", c.len()));
                    }
                    if !std::ptr::eq(c.parent.load(Ordering::Acquire), n) {
                        return Err("wrong parent pointer".into());
                    }
                    let first = &c.key()[..p];
                    if let Some(pf) = prev
                        && (pf[0] > first[0] || pf == first)
                    {
                        return Err("child table not sorted or first pages repeat".into());
                    }
                    prev = Some(first);
                    census.nodes += 1;
                    census.cached_tokens += c.len() as u64;
                    if s & PIN_MASK != 0 {
                        census.pinned_tokens += c.len() as u64;
                    }
                    self.check_swa_word(c, s, &mut census)?;
                    if c.is_leaf(&g) {
                        census.leaves += 1;
                        if s & PIN_MASK == 0 {
                            self.index.check_queued(c)?;
                        }
                    }
                    census.heap_bytes += c.heap_bytes() as u64;
                    stack.push(c);
                }
            }
        }
        self.index.check_entries(&g)?;
        if let Some(sw) = &self.swa {
            sw.check_entries(&g)?;
        }
        census.heap_bytes += self.index.heap_bytes() as u64;
        let st = self.stats();
        if st.cached_tokens != census.cached_tokens
            || st.protected_tokens != census.pinned_tokens
            || st.evictable_tokens != census.cached_tokens - census.pinned_tokens
            || st.nodes != census.nodes
            || st.namespaces != census.namespaces
            || st.swa_cached_tokens != census.swa_cached_tokens
            || st.swa_protected_tokens != census.swa_pinned_tokens
        {
            return Err(format!("counters {st:?} disagree with the tree {census:?}"));
        }
        if st.cached_tokens != st.evictable_tokens + st.protected_tokens {
            return Err(format!("cached != evictable + protected: {st:?}"));
        }
        Ok(census)
    }

    /// The SWA part of a reachable node's word `s` (see `swa.rs`): no SWA bit without a
    /// window; SWA pins never above pins; a tombstone has no SWA pin; live, unpinned SWA KV
    /// is in the SWA index.
    fn check_swa_word(
        &self,
        c: &Node,
        s: u64,
        census: &mut TreeCensus,
    ) -> std::result::Result<(), String> {
        use super::node::{SWA_GONE, SWA_PIN_MASK};
        let swa_pins = (s & SWA_PIN_MASK) >> 32;
        let Some(sw) = &self.swa else {
            return match s & (SWA_GONE | SWA_PIN_MASK) {
                0 => Ok(()),
                _ => Err(format!("an SWA bit in state {s:#x} without a window")),
            };
        };
        if swa_pins > s & PIN_MASK {
            return Err(format!("more SWA pins than pins in state {s:#x}"));
        }
        if s & SWA_GONE != 0 {
            if swa_pins != 0 {
                return Err(format!("an SWA pin on a tombstone, state {s:#x}"));
            }
            return Ok(());
        }
        census.swa_cached_tokens += c.len() as u64;
        if swa_pins == 0 {
            sw.check_queued(c)?;
        } else {
            census.swa_pinned_tokens += c.len() as u64;
        }
        Ok(())
    }

    /// Entries in the SWA index (some may be stale; 0 without a window); for tests.
    #[doc(hidden)] // a test hook
    pub fn swa_queue_len(&self) -> usize {
        self.swa.as_ref().map_or(0, |s| s.len())
    }

    /// Entries in the eviction index (some may be stale); for tests and benches.
    #[doc(hidden)] // a test hook: checks, not an engine API (kept public for the tests)
    pub fn eviction_queue_len(&self) -> usize {
        self.index.len()
    }
}
