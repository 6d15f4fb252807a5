//! The SWA component's public face (SGLang 0.5.23's `components/swa.py`): the insert with
//! SWA's cache actions, window locks, SWA values and tombstones, the window refresh, and the
//! SWA eviction walk. The rules themselves are in `tree.rs`.

use super::*;

/// An insert with SWA's rules ([`HybridTree::insert_swa`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwaInsert {
    /// Tokens the tree already held (SGLang's `prefix_len`).
    pub prefix_len: usize,
    /// The node the key ends on.
    pub node: NodeId,
    /// What the caller must do with its pools, in SGLang's order.
    pub actions: Vec<CacheAction>,
    /// Whether the window refresh that ends SGLang's insert was done here: `false` when an
    /// action is a barrier ([`CacheAction::SwaRebuild`],
    /// [`CacheAction::RecoverSwaWithLockedFull`]); then the caller carries the actions out
    /// and calls [`HybridTree::swa_refresh`] on `node`.
    pub refreshed: bool,
}

/// One step of the SWA eviction walk ([`HybridTree::swa_evict_next`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwaStep {
    /// A device leaf: the caller evicts it whole ([`HybridTree::evict_leaf`]).
    Leaf(NodeId),
    /// An internal node made an SWA tombstone: its SWA slots to free, named by their FULL
    /// indices (`full`), and the Mamba state that went with them (SGLang's cascade).
    Tombstoned {
        /// The node.
        node: NodeId,
        /// The node's FULL indices (SWA frees by FULL index).
        full: Vec<i64>,
        /// The node's Mamba state, freed with its SWA value, if it had an unlocked one.
        mamba: Option<Vec<i64>>,
    },
}

impl Tree {
    pub(super) fn need_swa(&self, what: &str) -> Result<()> {
        if self.window == 0 {
            return Err(Error::InvalidArgument(format!(
                "{what}: this tree core has no SWA component (made with swa_window=0)"
            )));
        }
        Ok(())
    }
}

impl HybridTree {
    /// The insert with SWA's rules (a tree with a window only): `swa_start` is the
    /// request's SWA-evicted prefix (page-aligned). See [`SwaInsert`].
    pub fn insert_swa(
        &mut self,
        ns: u32,
        key: &[i64],
        values: Option<&[i64]>,
        prev_prefix_len: usize,
        swa_start: usize,
    ) -> Result<SwaInsert> {
        let vals = values.unwrap_or(key);
        self.check_values(key.len(), vals.len())?;
        let page = self.t.page;
        if !swa_start.is_multiple_of(page) {
            return Err(Error::InvalidArgument(format!(
                "insert: the SWA-evicted prefix ({swa_start}) is not a multiple of the page size ({page}); nothing was inserted"
            )));
        }
        let t = &mut self.t;
        t.need_swa("insert_swa")?;
        let mut actions = Vec::new();
        let (prefix_len, node, frees) =
            t.insert_with(ns, key, vals, prev_prefix_len, swa_start, &mut actions);
        debug_assert!(frees.is_empty());
        let barrier = actions.iter().any(|a| {
            matches!(
                a,
                CacheAction::SwaRebuild { .. } | CacheAction::RecoverSwaWithLockedFull { .. }
            )
        });
        if !barrier && node != t.root {
            t.swa_refresh(node);
        }
        Ok(SwaInsert { prefix_len, node: t.n(node).id, actions, refreshed: !barrier })
    }

    /// Takes the SWA window lock from `node` (SGLang's SWA `acquire_component_lock`);
    /// returns the segment boundary's stamp (0: the segment reached the root), which the
    /// release names.
    pub fn swa_inc_lock(&mut self, node: NodeId) -> Result<u64> {
        let s = self.t.slot(node)?;
        self.t.need_swa("swa_inc_lock")?;
        Ok(self.t.swa_lock(s))
    }

    /// Releases a window lock taken by [`HybridTree::swa_inc_lock`] with stamp `uuid`.
    pub fn swa_dec_lock(&mut self, node: NodeId, uuid: u64) -> Result<()> {
        let s = self.t.slot(node)?;
        self.t.need_swa("swa_dec_lock")?;
        self.t.swa_unlock(s, uuid, false).map(|_| ())
    }

    /// SGLang's `dec_swa_lock_only` (`release_window_lock`): releases the window lock early;
    /// returns the FULL indices of the SWA values it evicted (SWA frees by FULL index).
    pub fn swa_release_window(&mut self, node: NodeId, uuid: u64) -> Result<Vec<i64>> {
        let s = self.t.slot(node)?;
        self.t.need_swa("dec_swa_lock_only")?;
        self.t.swa_unlock(s, uuid, true)
    }

    /// Stores the node's SWA value (the cache's `SWARebuild`: SGLang's
    /// `set_component_device_value`), the most recent in the SWA LRU.
    pub fn swa_set_value(&mut self, node: NodeId, value: Vec<i64>) -> Result<()> {
        let s = self.t.slot(node)?;
        self.t.need_swa("set_component_device_value")?;
        self.t.swa_set(s, value)
    }

    /// The node's SWA value, or `None` (a tombstone, or no SWA component).
    pub fn swa_value(&self, node: NodeId) -> Result<Option<&[i64]>> {
        let s = self.t.slot(node)?;
        Ok(self.t.n(s).swa.value.as_deref())
    }

    /// SWA's sizes, in tokens.
    pub fn swa_sizes(&self) -> Sizes {
        Sizes { evictable: self.t.swa_evictable, protected: self.t.swa_protected }
    }

    /// The SWA LRU, most recent first.
    pub fn swa_lru(&self) -> Vec<NodeId> {
        self.t.list_ids(self.t.lru_head, |n| n.lru_next)
    }

    /// Refreshes the window back from `node` in the SWA LRU (SGLang's INSERT_END refresh).
    pub fn swa_refresh(&mut self, node: NodeId) -> Result<()> {
        let s = self.t.slot(node)?;
        self.t.need_swa("swa_refresh")?;
        self.t.swa_refresh(s);
        Ok(())
    }

    /// Starts SGLang's SWA device-eviction walk for `request` SWA tokens: from the least
    /// recent unlocked SWA value.
    pub fn swa_evict_start(&mut self, request: u64) -> Result<()> {
        let t = &mut self.t;
        t.need_swa("evict_device_start(SWA)")?;
        let c = t.lru_unlocked_from(t.lru_tail);
        let cur = (c != NONE).then(|| (c, t.n(c).id));
        t.walk.swa_cursor = cur;
        t.walk.swa_request = request;
        t.walk.swa_open = true;
        Ok(())
    }

    /// One step of the SWA walk, `evicted` SWA tokens so far: `None` when done. See
    /// [`SwaStep`].
    pub fn swa_evict_next(&mut self, evicted: u64) -> Result<Option<SwaStep>> {
        let t = &mut self.t;
        if !t.walk.swa_open {
            return Err(Error::NoWalk { walk: "SWA" });
        }
        let listed = |t: &Tree, c: Option<(u32, u64)>| {
            c.is_some_and(|(s, id)| {
                t.nodes
                    .get(s as usize)
                    .and_then(|n| n.as_ref())
                    .is_some_and(|n| n.id == id && n.in_lru)
            })
        };
        if t.walk.swa_cursor.is_some() && !listed(t, t.walk.swa_cursor) {
            let c = t.lru_unlocked_from(t.lru_tail);
            t.walk.swa_cursor = (c != NONE).then(|| (c, t.n(c).id));
        }
        if evicted >= t.walk.swa_request || !listed(t, t.walk.swa_cursor) {
            return Ok(None);
        }
        let (x, id) = t.walk.swa_cursor.expect("listed");
        let p = t.n(x).lru_prev;
        let p = if p == NONE { NONE } else { t.lru_unlocked_from(p) };
        t.walk.swa_cursor = (p != NONE).then(|| (p, t.n(p).id));
        if t.leaves.contains(&x) {
            return Ok(Some(SwaStep::Leaf(id)));
        }
        let full = t.n(x).full.value.clone().unwrap_or_default();
        t.swa_tombstone(x);
        // SGLang's cascade: Mamba (internal priority 0) goes with SWA (1) on the node. A
        // Mamba-locked state stays (SGLang asserts there is none: an SWA walk meets only
        // nodes without a window lock, and a request's lock takes both or releases both).
        let m = t.n(x).mamba.value.is_some() && t.n(x).mamba.lock_ref == 0;
        let mamba = if m { Some(t.mamba_take(x)) } else { None };
        Ok(Some(SwaStep::Tombstoned { node: id, full, mamba }))
    }

    /// Ends the SWA walk.
    pub fn swa_evict_end(&mut self) {
        self.t.walk.swa_cursor = None;
        self.t.walk.swa_open = false;
    }

    /// SGLang's `swa_tombstone_ranges`: the maximal SWA-tombstoned ranges of `key`'s path
    /// within `[start, end)`.
    pub fn swa_tombstone_ranges(
        &self,
        ns: u32,
        key: &[i64],
        start: usize,
        end: usize,
    ) -> Result<Vec<(usize, usize)>> {
        let t = &self.t;
        t.need_swa("swa_tombstone_ranges")?;
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for (c, pos, p) in t.walk_span(ns, key, end) {
            let seg_end = pos + p;
            if seg_end <= start || t.n(c).swa.value.is_some() {
                continue;
            }
            let (lo, hi) = (start.max(pos), end.min(seg_end));
            match ranges.last_mut() {
                Some(last) if last.1 == lo => last.1 = hi,
                _ => ranges.push((lo, hi)),
            }
            if hi >= end {
                break;
            }
        }
        Ok(ranges)
    }

    /// SGLang's `attach_swa_window`: stores `swa_values` (SWA indices for the tokens
    /// `[window_start, window_end)` of `key`'s path) on that span's tombstones, splitting
    /// the end nodes at the span's edges. Refused, with nothing changed, when the span is not
    /// all tombstones on the tree or the values do not fit it.
    pub fn attach_swa_window(
        &mut self,
        ns: u32,
        key: &[i64],
        window_start: usize,
        window_end: usize,
        swa_values: &[i64],
    ) -> Result<()> {
        let refuse = |why: String| {
            Err(Error::InvalidArgument(format!(
                "attach_swa_window [{window_start}, {window_end}): {why}; nothing was changed"
            )))
        };
        if window_end < window_start || swa_values.len() != window_end - window_start {
            return refuse(format!("{} SWA values for the span", swa_values.len()));
        }
        if window_start == window_end {
            return Ok(()); // nothing to attach
        }
        let page = self.t.page;
        if !window_start.is_multiple_of(page) || !window_end.is_multiple_of(page) {
            // Nodes hold whole pages: a span edge inside a page would split one.
            return refuse(format!("the span's edges are not multiples of the page size ({page})"));
        }
        let t = &mut self.t;
        t.need_swa("attach_swa_window")?;
        let mut segs = Vec::new();
        let mut covered = window_start;
        for (c, pos, p) in t.walk_span(ns, key, window_end) {
            let seg_end = pos + p;
            if seg_end <= window_start {
                continue;
            }
            let (lo, hi) = (pos.max(window_start), seg_end.min(window_end));
            if t.n(c).swa.value.is_some() {
                return refuse(format!("live SWA at [{lo}, {hi})"));
            }
            segs.push((c, pos, lo, hi));
            covered = hi;
            if covered >= window_end {
                break;
            }
        }
        if covered != window_end {
            return refuse(format!("the tree holds the path only to {covered}"));
        }
        for (c, pos, lo, hi) in segs {
            if lo > pos {
                t.split(c, lo - pos);
            }
            let target = if lo + t.n(c).key.len() > hi { t.split(c, hi - lo) } else { c };
            let v = swa_values[lo - window_start..hi - window_start].to_vec();
            t.swa_set(target, v)?;
        }
        Ok(())
    }
}
