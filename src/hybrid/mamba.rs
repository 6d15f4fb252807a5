//! The Mamba component's rules (SGLang 0.5.23's `components/mamba.py` and the parts of
//! `unified_tree_core.py` that drive it): one recurrent state per node, held only where a
//! request's sequence ended (a split leaves it on the suffix, the old node), a lock on the
//! node alone, an LRU of its own refreshed only by a match's chosen node, and an eviction
//! walk from the LRU end that hands a device leaf to the controller (evicted whole) and
//! makes any other node a Mamba tombstone (its state freed, its FULL KV kept). Mamba's
//! eviction priority is the lowest on an internal node (FULL 2, SWA 1, Mamba 0): an SWA
//! tombstone takes the node's Mamba state with it, a Mamba tombstone takes nothing else.

use super::*;

/// One step of the Mamba eviction walk ([`HybridTree::mamba_evict_next`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MambaStep {
    /// A device leaf: the caller evicts it whole ([`HybridTree::evict_leaf`]).
    Leaf(NodeId),
    /// A node made a Mamba tombstone: its state, to free (its FULL KV stays).
    Tombstoned {
        /// The node.
        node: NodeId,
        /// The state's Mamba pool indices.
        state: Vec<i64>,
    },
}

impl Tree {
    pub(super) fn need_mamba(&self, what: &str) -> Result<()> {
        if !self.mamba {
            return Err(Error::InvalidArgument(format!(
                "{what}: this tree core has no Mamba component (made with mamba=False)"
            )));
        }
        Ok(())
    }

    pub(super) fn mamba_len(&self, s: u32) -> u64 {
        self.n(s).mamba.value.as_ref().map_or(0, |v| v.len() as u64)
    }

    /// Links `s` just after `prev` in the Mamba LRU (toward the LRU end); `prev == NONE`: at
    /// the MRU end.
    pub(super) fn mlru_insert_after(&mut self, prev: u32, s: u32) {
        debug_assert!(!self.n(s).in_mlru);
        let next = if prev == NONE { self.mlru_head } else { self.n(prev).mlru_next };
        {
            let n = self.n_mut(s);
            n.mlru_prev = prev;
            n.mlru_next = next;
            n.in_mlru = true;
        }
        if prev == NONE {
            self.mlru_head = s
        } else {
            self.n_mut(prev).mlru_next = s
        }
        if next == NONE { self.mlru_tail = s } else { self.n_mut(next).mlru_prev = s }
    }

    pub(super) fn mlru_remove(&mut self, s: u32) {
        if !self.n(s).in_mlru {
            return;
        }
        let (prev, next) = {
            let n = self.n_mut(s);
            n.in_mlru = false;
            (std::mem::replace(&mut n.mlru_prev, NONE), std::mem::replace(&mut n.mlru_next, NONE))
        };
        if prev == NONE {
            self.mlru_head = next
        } else {
            self.n_mut(prev).mlru_next = next
        }
        if next == NONE { self.mlru_tail = prev } else { self.n_mut(next).mlru_prev = prev }
    }

    /// SGLang's `reset_node_mru` on the Mamba LRU (a node holding a state).
    pub(super) fn mlru_touch(&mut self, s: u32) {
        if self.n(s).in_mlru {
            self.mlru_remove(s);
            self.mlru_insert_after(NONE, s);
        }
    }

    /// The least recent unlocked Mamba state from `u` (inclusive) toward the MRU end.
    pub(super) fn mlru_unlocked_from(&self, mut u: u32) -> u32 {
        while u != NONE && self.n(u).mamba.lock_ref > 0 {
            u = self.n(u).mlru_prev;
        }
        u
    }

    /// Stores a state on `s` (SGLang's `set_component_device_value` for Mamba): the most
    /// recent in the Mamba LRU, protected when the node is Mamba-locked.
    pub(super) fn mamba_put(&mut self, s: u32, value: Vec<i64>) {
        let len = value.len() as u64;
        let locked = self.n(s).mamba.lock_ref > 0;
        self.n_mut(s).mamba.value = Some(value);
        self.mlru_insert_after(NONE, s);
        if locked { self.mamba_protected += len } else { self.mamba_evictable += len }
    }

    /// Why `value` cannot be stored on `s` as its Mamba state, or None.
    pub(super) fn mamba_refusal(&self, s: u32, value: &[i64]) -> Option<String> {
        let n = self.n(s);
        if s == self.root {
            Some(format!("node {} is the root", n.id))
        } else if n.mamba.value.is_some() {
            Some(format!("node {} already has a Mamba state", n.id))
        } else if value.is_empty() {
            Some("the Mamba state is empty".to_string())
        } else {
            None
        }
    }

    /// SGLang's Mamba `commit_insert_component_data` on the insert's target node `s`
    /// (`new_leaf`: the insert made it): a new leaf or a node without a state takes
    /// `value`, one that has a state keeps it (returns true: SGLang's `mamba_exist`, the
    /// request keeps its state) and becomes the most recent.
    pub(super) fn mamba_commit(&mut self, s: u32, new_leaf: bool, value: &[i64]) -> bool {
        if new_leaf {
            self.mamba_put(s, value.to_vec());
            return false;
        }
        if self.n(s).mamba.value.is_none() {
            self.mamba_put(s, value.to_vec());
            let t = self.tick();
            self.n_mut(s).last_access = t;
            return false;
        }
        self.mlru_touch(s);
        let t = self.tick();
        self.n_mut(s).last_access = t;
        true
    }

    /// SGLang's Mamba `acquire_component_lock`: the node alone (tombstones counted too).
    pub(super) fn mamba_lock(&mut self, s: u32) {
        if s == self.root {
            return;
        }
        let len = self.mamba_len(s);
        let n = self.n_mut(s);
        if n.mamba.lock_ref == 0 && n.mamba.value.is_some() {
            self.mamba_evictable -= len;
            self.mamba_protected += len;
        }
        self.n_mut(s).mamba.lock_ref += 1;
        self.refresh_leaf(s);
    }

    /// SGLang's Mamba `release_component_lock`; refused, with nothing changed, on an
    /// unlocked node.
    pub(super) fn mamba_unlock(&mut self, s: u32) -> Result<()> {
        if s == self.root {
            return Ok(());
        }
        let len = self.mamba_len(s);
        let n = self.n_mut(s);
        if n.mamba.lock_ref == 0 {
            return Err(Error::InvalidArgument(format!(
                "dec_lock_ref: node {} has Mamba lock_ref 0 (released more often than locked); \
                 nothing was changed",
                n.id
            )));
        }
        if n.mamba.lock_ref == 1 && n.mamba.value.is_some() {
            self.mamba_evictable += len;
            self.mamba_protected -= len;
        }
        let n = self.n_mut(s);
        n.mamba.lock_ref -= 1;
        if n.mamba.lock_ref == 0 {
            self.refresh_leaf(s);
        }
        Ok(())
    }

    /// Drops node `s`'s Mamba state (a Mamba tombstone: its FULL and SWA values stay);
    /// returns the state to free.
    pub(super) fn mamba_take(&mut self, s: u32) -> Vec<i64> {
        let len = self.mamba_len(s);
        self.mlru_remove(s);
        let n = self.n_mut(s);
        let v = n.mamba.value.take().unwrap_or_default();
        if n.mamba.lock_ref > 0 {
            self.mamba_protected -= len
        } else {
            self.mamba_evictable -= len
        }
        self.refresh_leaf(s);
        v
    }

    /// One step of SGLang's Mamba device-eviction walk (`evicted`: Mamba states evicted so
    /// far): None (done), `(leaf, None)` (a device leaf for the controller to evict whole),
    /// or `(node, state)`: a node made a Mamba tombstone, its state to free.
    pub(super) fn mamba_walk_next(&mut self, evicted: u64) -> Option<(u64, Option<Vec<i64>>)> {
        let listed = |t: &Tree, c: Option<(u32, u64)>| {
            c.is_some_and(|(s, id)| {
                t.nodes
                    .get(s as usize)
                    .and_then(|n| n.as_ref())
                    .is_some_and(|n| n.id == id && n.in_mlru)
            })
        };
        if self.walk.mamba_cursor.is_some() && !listed(self, self.walk.mamba_cursor) {
            let c = self.mlru_unlocked_from(self.mlru_tail);
            self.walk.mamba_cursor = (c != NONE).then(|| (c, self.n(c).id));
        }
        if evicted >= self.walk.mamba_request || !listed(self, self.walk.mamba_cursor) {
            return None;
        }
        let (x, id) = self.walk.mamba_cursor.expect("listed");
        let p = self.n(x).mlru_prev;
        let p = if p == NONE { NONE } else { self.mlru_unlocked_from(p) };
        self.walk.mamba_cursor = (p != NONE).then(|| (p, self.n(p).id));
        if self.leaves.contains(&x) {
            return Some((id, None));
        }
        Some((id, Some(self.mamba_take(x))))
    }

    /// SGLang's `_evict_excess_path_states`: past `cap` states on the root path of `tail`,
    /// the shallowest eligible ones (not the tail, unlocked, one child, not a device leaf)
    /// become Mamba tombstones; returns their states, shallowest first.
    pub(super) fn mamba_evict_excess(&mut self, tail: u32, cap: usize) -> Vec<Vec<i64>> {
        let holders: Vec<u32> = self
            .path_to_root(tail)
            .into_iter()
            .filter(|&u| self.n(u).mamba.value.is_some())
            .collect();
        let mut excess = holders.len().saturating_sub(cap);
        let mut out = Vec::new();
        for &u in holders.iter().rev() {
            if excess == 0 || u == tail {
                break;
            }
            if self.n(u).mamba.lock_ref > 0 || self.kid_count(u) != 1 || self.leaves.contains(&u) {
                continue;
            }
            out.push(self.mamba_take(u));
            excess -= 1;
        }
        out
    }
}

impl HybridTree {
    /// SGLang's Mamba commit on an insert's target `node` (`new_leaf`: the insert made it),
    /// `state` the request's: returns SGLang's `mamba_exist` (`true`: the node kept the
    /// state it had; the request keeps its own). Refused on the root, for an empty state,
    /// and for a "new leaf" that has a state.
    pub fn mamba_commit(&mut self, node: NodeId, new_leaf: bool, state: &[i64]) -> Result<bool> {
        let t = &mut self.t;
        let s = t.slot(node)?;
        t.need_mamba("insert(mamba_value)")?;
        let why = if s == t.root {
            Some(format!("node {node} is the root"))
        } else if state.is_empty() {
            Some("the Mamba state is empty".to_string())
        } else if new_leaf && t.n(s).mamba.value.is_some() {
            Some(format!("node {node} is not a new leaf: it has a Mamba state"))
        } else {
            None
        };
        if let Some(why) = why {
            return Err(Error::InvalidArgument(format!(
                "insert: {why}; the Mamba state was not stored"
            )));
        }
        Ok(t.mamba_commit(s, new_leaf, state))
    }

    /// Stores the node's Mamba state (SGLang's `set_component_device_value` for Mamba).
    pub fn mamba_set_value(&mut self, node: NodeId, state: Vec<i64>) -> Result<()> {
        let t = &mut self.t;
        let s = t.slot(node)?;
        t.need_mamba("set_component_device_value")?;
        if let Some(why) = t.mamba_refusal(s, &state) {
            return Err(Error::InvalidArgument(format!(
                "set_component_device_value: {why}; nothing was changed"
            )));
        }
        t.mamba_put(s, state);
        Ok(())
    }

    /// The node's Mamba state, or `None` (none, a tombstone, or no Mamba component).
    pub fn mamba_value(&self, node: NodeId) -> Result<Option<&[i64]>> {
        let s = self.t.slot(node)?;
        Ok(self.t.n(s).mamba.value.as_deref())
    }

    /// Mamba's sizes, in states.
    pub fn mamba_sizes(&self) -> Sizes {
        Sizes { evictable: self.t.mamba_evictable, protected: self.t.mamba_protected }
    }

    /// The Mamba LRU, most recent first.
    pub fn mamba_lru(&self) -> Vec<NodeId> {
        self.t.list_ids(self.t.mlru_head, |n| n.mlru_next)
    }

    /// Takes the Mamba lock on `node` alone (SGLang's Mamba `acquire_component_lock`).
    pub fn mamba_inc_lock(&mut self, node: NodeId) -> Result<()> {
        let s = self.t.slot(node)?;
        self.t.need_mamba("mamba_inc_lock")?;
        self.t.mamba_lock(s);
        Ok(())
    }

    /// Releases a lock taken by [`HybridTree::mamba_inc_lock`].
    pub fn mamba_dec_lock(&mut self, node: NodeId) -> Result<()> {
        let s = self.t.slot(node)?;
        self.t.need_mamba("mamba_dec_lock")?;
        self.t.mamba_unlock(s)
    }

    /// Starts SGLang's Mamba device-eviction walk for `request` states: from the least
    /// recent unlocked state.
    pub fn mamba_evict_start(&mut self, request: u64) -> Result<()> {
        let t = &mut self.t;
        t.need_mamba("evict_device_start(MAMBA)")?;
        let c = t.mlru_unlocked_from(t.mlru_tail);
        let cur = (c != NONE).then(|| (c, t.n(c).id));
        t.walk.mamba_cursor = cur;
        t.walk.mamba_request = request;
        t.walk.mamba_open = true;
        Ok(())
    }

    /// One step of the Mamba walk, `evicted` states so far: `None` when done. See
    /// [`MambaStep`].
    pub fn mamba_evict_next(&mut self, evicted: u64) -> Result<Option<MambaStep>> {
        if !self.t.walk.mamba_open {
            return Err(Error::NoWalk { walk: "Mamba" });
        }
        Ok(self.t.mamba_walk_next(evicted).map(|(node, state)| match state {
            None => MambaStep::Leaf(node),
            Some(state) => MambaStep::Tombstoned { node, state },
        }))
    }

    /// Ends the Mamba walk.
    pub fn mamba_evict_end(&mut self) {
        self.t.walk.mamba_cursor = None;
        self.t.walk.mamba_open = false;
    }

    /// SGLang's `evict_excess_path_states` with the path cap `cap` (at least 1): the states
    /// made tombstones on `node`'s root path, shallowest first.
    pub fn mamba_evict_excess(&mut self, node: NodeId, cap: usize) -> Result<Vec<Vec<i64>>> {
        let s = self.t.slot(node)?;
        self.t.need_mamba("evict_excess_path_states")?;
        if cap == 0 {
            return Err(Error::InvalidArgument(
                "evict_excess_path_states: the path cap must be at least 1 (SGLang's \
                 mamba_max_states_per_path: -1 or a positive integer); nothing was changed"
                    .into(),
            ));
        }
        Ok(self.t.mamba_evict_excess(s, cap))
    }
}
