//! Reading a hybrid tree: nodes, their components, the walk order, and the consistency
//! check the tests run after every step.

use super::*;

/// A node's FULL state and place ([`HybridTree::node_info`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeInfo {
    /// The parent's id (`None` for the root).
    pub parent: Option<NodeId>,
    /// Key length in tokens.
    pub key_len: usize,
    /// FULL value length (`None`: evicted from the device).
    pub value_len: Option<usize>,
    /// FULL lock ref.
    pub lock_ref: u32,
    /// Live children.
    pub children: usize,
    /// SGLang's `last_access` stamp.
    pub last_access: f64,
    /// The namespace.
    pub ns: u32,
}

/// A node's SWA state ([`HybridTree::swa_info`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwaInfo {
    /// SWA value length (`None`: a tombstone, or no SWA component).
    pub value_len: Option<usize>,
    /// Window lock ref.
    pub lock_ref: u32,
    /// The window-lock boundary stamp on this node (0: none).
    pub uuid: u64,
    /// Whether the node is in the SWA LRU.
    pub in_lru: bool,
}

/// A node's Mamba state ([`HybridTree::mamba_info`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MambaInfo {
    /// State length (`None`: no state).
    pub value_len: Option<usize>,
    /// Mamba lock ref.
    pub lock_ref: u32,
    /// Whether the node is in the Mamba LRU.
    pub in_lru: bool,
}

impl Tree {
    /// Walks an LRU list from `head` checking its back links (`links`: a node's `(prev,
    /// next)`): `Err` for a broken link, `Ok(Some(walked))` when it does not hold `listed`
    /// nodes or does not end at `tail`, `Ok(None)` when sound.
    fn list_walk(
        &self,
        head: u32,
        tail: u32,
        listed: usize,
        links: impl Fn(&Node) -> (u32, u32),
    ) -> std::result::Result<Option<usize>, ()> {
        let (mut walked, mut u, mut prev) = (0usize, head, NONE);
        while u != NONE {
            let (p, next) = links(self.n(u));
            if p != prev || walked > listed {
                return Err(());
            }
            walked += 1;
            prev = u;
            u = next;
        }
        Ok((walked != listed || tail != prev).then_some(walked))
    }

    /// The node ids of an LRU list from `head`, following `next` (most recent first).
    pub(super) fn list_ids(&self, head: u32, next: impl Fn(&Node) -> u32) -> Vec<u64> {
        let mut out = Vec::new();
        let mut u = head;
        while u != NONE {
            out.push(self.n(u).id);
            u = next(self.n(u));
        }
        out
    }
}

impl HybridTree {
    /// Whether the node has no FULL device value (the root never).
    pub fn is_evicted(&self, node: NodeId) -> Result<bool> {
        let s = self.t.slot(node)?;
        Ok(s != self.t.root && self.t.n(s).full.value.is_none())
    }

    /// Whether `node` is the root.
    pub fn is_root(&self, node: NodeId) -> Result<bool> {
        Ok(self.t.slot(node)? == self.t.root)
    }

    /// The node's FULL state and place.
    pub fn node_info(&self, node: NodeId) -> Result<NodeInfo> {
        let t = &self.t;
        let s = t.slot(node)?;
        let n = t.n(s);
        Ok(NodeInfo {
            parent: (n.parent != NONE).then(|| t.n(n.parent).id),
            key_len: n.key.len(),
            value_len: n.full.value.as_ref().map(Vec::len),
            lock_ref: n.full.lock_ref,
            children: t.kid_count(s),
            last_access: n.last_access,
            ns: n.ns,
        })
    }

    /// The node's SWA state.
    pub fn swa_info(&self, node: NodeId) -> Result<SwaInfo> {
        let n = self.t.n(self.t.slot(node)?);
        Ok(SwaInfo {
            value_len: n.swa.value.as_ref().map(Vec::len),
            lock_ref: n.swa.lock_ref,
            uuid: n.swa_uuid,
            in_lru: n.in_lru,
        })
    }

    /// The node's Mamba state.
    pub fn mamba_info(&self, node: NodeId) -> Result<MambaInfo> {
        let n = self.t.n(self.t.slot(node)?);
        Ok(MambaInfo {
            value_len: n.mamba.value.as_ref().map(Vec::len),
            lock_ref: n.mamba.lock_ref,
            in_lru: n.in_mlru,
        })
    }

    /// The node's children, in insertion order.
    pub fn children(&self, node: NodeId) -> Result<Vec<NodeId>> {
        let t = &self.t;
        Ok(t.kids(t.slot(node)?).map(|c| t.n(c).id).collect())
    }

    /// The node's key tokens.
    pub fn key(&self, node: NodeId) -> Result<&[i64]> {
        Ok(&self.t.n(self.t.slot(node)?).key)
    }

    /// The node's FULL device value, or `None` when evicted.
    pub fn value(&self, node: NodeId) -> Result<Option<&[i64]>> {
        Ok(self.t.n(self.t.slot(node)?).full.value.as_deref())
    }

    /// Every node id, depth first from the root in child order (the root first).
    pub fn dfs(&self) -> Vec<NodeId> {
        let t = &self.t;
        let mut out = Vec::new();
        let mut stack = vec![t.root];
        while let Some(s) = stack.pop() {
            out.push(t.n(s).id);
            for c in t.kids(s).rev() {
                stack.push(c);
            }
        }
        out
    }

    /// Nodes held (the root included).
    pub fn node_count(&self) -> usize {
        self.t.ids.len()
    }

    /// Why the tree is inconsistent (sizes against a recount, leaf set, lock refs, parent
    /// links, LRU lists), or `None`.
    pub fn check(&self) -> Option<String> {
        let t = &self.t;
        let (mut ev, mut pr) = (0u64, 0u64);
        let (mut sev, mut spr, mut listed) = (0u64, 0u64, 0usize);
        let (mut mev, mut mpr, mut mlisted) = (0u64, 0u64, 0usize);
        let mut stack = vec![t.root];
        let mut seen = 0usize;
        while let Some(s) = stack.pop() {
            seen += 1;
            let n = t.n(s);
            if n.mamba.value.is_some() != n.in_mlru {
                return Some(format!("node {}: Mamba state and Mamba LRU membership differ", n.id));
            }
            if let Some(v) = n.mamba.value.as_ref() {
                mlisted += 1;
                if n.mamba.lock_ref > 0 { mpr += v.len() as u64 } else { mev += v.len() as u64 }
            }
            if n.swa.value.is_some() != n.in_lru {
                return Some(format!("node {}: SWA value and SWA LRU membership differ", n.id));
            }
            if let Some(v) = n.swa.value.as_ref() {
                if v.len() != n.key.len() {
                    return Some(format!(
                        "node {}: SWA value length differs from key length",
                        n.id
                    ));
                }
                listed += 1;
                if n.swa.lock_ref > 0 { spr += v.len() as u64 } else { sev += v.len() as u64 }
            }
            if s != t.root {
                let len = t.vlen(s);
                if n.full.lock_ref > 0 {
                    pr += len
                } else {
                    ev += len
                }
                if n.full.value.as_ref().is_some_and(|v| v.len() != n.key.len()) {
                    return Some(format!("node {}: value length differs from key length", n.id));
                }
                if n.key.is_empty() || !n.key.len().is_multiple_of(t.page) {
                    return Some(format!(
                        "node {}: key length {} not a page multiple",
                        n.id,
                        n.key.len()
                    ));
                }
            }
            if t.is_leaf(s) != t.leaves.contains(&s) {
                return Some(format!("node {}: leaf set out of date", n.id));
            }
            for c in t.kids(s) {
                if t.n(c).parent != s {
                    return Some(format!("node {}: parent link broken", t.n(c).id));
                }
                if n.full.lock_ref < t.n(c).full.lock_ref && s != t.root {
                    return Some(format!("node {}: locked less than its child", n.id));
                }
                stack.push(c);
            }
        }
        if seen != t.ids.len() {
            return Some(format!("{} nodes reachable, {} registered", seen, t.ids.len()));
        }
        let swa = t.list_walk(t.lru_head, t.lru_tail, listed, |n| (n.lru_prev, n.lru_next));
        let mamba = t.list_walk(t.mlru_head, t.mlru_tail, mlisted, |n| (n.mlru_prev, n.mlru_next));
        for (name, n, what, walk) in
            [("SWA", listed, "have SWA values", swa), ("Mamba", mlisted, "have states", mamba)]
        {
            match walk {
                Err(()) => return Some(format!("{name} LRU links broken")),
                Ok(Some(walked)) => {
                    return Some(format!("{name} LRU holds {walked} nodes, {n} {what}"));
                }
                Ok(None) => {}
            }
        }
        if (mev, mpr) != (t.mamba_evictable, t.mamba_protected) {
            return Some(format!(
                "Mamba sizes: counted evictable {mev} protected {mpr}, kept {} {}",
                t.mamba_evictable, t.mamba_protected
            ));
        }
        if (sev, spr) != (t.swa_evictable, t.swa_protected) {
            return Some(format!(
                "SWA sizes: counted evictable {sev} protected {spr}, kept {} {}",
                t.swa_evictable, t.swa_protected
            ));
        }
        if (ev, pr) != (t.evictable, t.protected) {
            return Some(format!(
                "sizes: counted evictable {ev} protected {pr}, kept {} {}",
                t.evictable, t.protected
            ));
        }
        None
    }
}
