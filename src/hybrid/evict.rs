//! One component's whole eviction walk, as SGLang's controller drives it: what a caller
//! that does not drive the step-wise walk itself (the C ABI's `rkv_hybrid_evict`, C++'s
//! `rkv::HybridTree::evict`) runs.

use super::*;

/// A component of the hybrid tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Component {
    /// Full attention's KV (tokens).
    Full,
    /// Sliding-window attention's KV (tokens; named by their FULL indices, as SGLang frees
    /// SWA slots).
    Swa,
    /// Mamba's recurrent states (state slots).
    Mamba,
}

/// What an eviction freed, for the caller's pools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freed {
    /// The pool the indices go back to.
    pub component: Component,
    /// FULL indices (for [`Component::Full`] and [`Component::Swa`]) or a Mamba state.
    pub indices: Vec<i64>,
}

impl HybridTree {
    /// Whether the tree has `component` (FULL always).
    pub fn has(&self, component: Component) -> bool {
        match component {
            Component::Full => true,
            Component::Swa => self.t.window > 0,
            Component::Mamba => self.t.mamba,
        }
    }

    /// Evicts a device leaf whole: its FULL indices, its SWA slots (by FULL index) where it
    /// has an SWA value, its Mamba state; returns the leaf's count in `counted`'s units.
    fn evict_whole(
        &mut self,
        node: NodeId,
        counted: Component,
        out: &mut Vec<Freed>,
    ) -> Result<u64> {
        let swa = self.swa_value(node)?.map(<[i64]>::len);
        let state = self.mamba_value(node)?.map(<[i64]>::to_vec);
        let full = self.evict_leaf(node)?;
        let n = match counted {
            Component::Full => full.len() as u64,
            Component::Swa => swa.unwrap_or(0) as u64,
            Component::Mamba => state.as_ref().map_or(0, |s| s.len() as u64),
        };
        if swa.is_some() {
            out.push(Freed { component: Component::Swa, indices: full.clone() });
        }
        if let Some(s) = state {
            out.push(Freed { component: Component::Mamba, indices: s });
        }
        out.push(Freed { component: Component::Full, indices: full });
        Ok(n)
    }

    /// Evicts at least `request` of `component` (FULL and SWA in tokens, Mamba in state
    /// slots; less only when nothing more of it is evictable), running SGLang's walk for
    /// that component to its end: FULL takes the evictable leaves, oldest first; SWA and
    /// Mamba walk their LRU from the least recent unlocked value, evicting a device leaf
    /// whole and making any other node a tombstone of that component (an SWA tombstone
    /// takes the node's Mamba state with it). Everything freed is appended to `freed`
    /// (also what was freed before an error, which only a bug makes). Returns the amount
    /// of `component` evicted. Refused ([`Error::InvalidArgument`]) for a component the
    /// tree does not have.
    pub fn evict(
        &mut self,
        component: Component,
        request: u64,
        freed: &mut Vec<Freed>,
    ) -> Result<u64> {
        if !self.has(component) {
            return Err(Error::InvalidArgument(format!(
                "evict: this tree core has no {component:?} component"
            )));
        }
        let mut evicted = 0u64;
        let r = match component {
            Component::Full => {
                self.evict_start(request);
                let r = (|| {
                    while let Some(node) = self.evict_next(evicted)? {
                        evicted += self.evict_whole(node, component, freed)?;
                    }
                    Ok(())
                })();
                self.evict_end();
                r
            }
            Component::Swa => {
                self.swa_evict_start(request)?;
                let r = (|| {
                    while let Some(step) = self.swa_evict_next(evicted)? {
                        match step {
                            SwaStep::Leaf(node) => {
                                evicted += self.evict_whole(node, component, freed)?
                            }
                            SwaStep::Tombstoned { full, mamba, .. } => {
                                evicted += full.len() as u64;
                                freed.push(Freed { component: Component::Swa, indices: full });
                                if let Some(m) = mamba {
                                    freed.push(Freed { component: Component::Mamba, indices: m });
                                }
                            }
                        }
                    }
                    Ok(())
                })();
                self.swa_evict_end();
                r
            }
            Component::Mamba => {
                self.mamba_evict_start(request)?;
                let r = (|| {
                    while let Some(step) = self.mamba_evict_next(evicted)? {
                        match step {
                            MambaStep::Leaf(node) => {
                                evicted += self.evict_whole(node, component, freed)?
                            }
                            MambaStep::Tombstoned { state, .. } => {
                                evicted += state.len() as u64;
                                freed.push(Freed { component: Component::Mamba, indices: state });
                            }
                        }
                    }
                    Ok(())
                })();
                self.mamba_evict_end();
                r
            }
        };
        r.map(|()| evicted)
    }
}
