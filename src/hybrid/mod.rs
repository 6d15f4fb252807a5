//! The hybrid tree: the node-shaped radix tree of SGLang 0.5.23's `UnifiedRadixCache`, with
//! its components, for engines that serve hybrid models: FULL attention always, SWA
//! (sliding-window hybrids: Gemma 3, gpt-oss, Llama 4) when the tree has a window, and Mamba
//! (state-space hybrids: Qwen3-Next, Nemotron-H, Jamba) when it has one. Python's
//! `NativeTreeCore` (SGLang's `radixkv` tree core), the C ABI's `rkv_hybrid` and C++'s
//! `rkv::HybridTree` are faces of this one type.
//!
//! # The contract
//!
//! SGLang's tree-core contract is node-shaped: the caller holds node ids ([`NodeId`])
//! across calls (a match's `last_device_node`, a lock's anchor, an eviction step's victim),
//! a match or an insert that ends inside a node splits it (the new node is the prefix, the
//! old id stays with the suffix), values are the allocator's int64 device indices, and the
//! eviction walk is driven one leaf at a time by the caller ([`HybridTree::evict_start`],
//! [`HybridTree::evict_next`], [`HybridTree::evict_leaf`]). "The tree decides, the cache
//! executes": the tree owns structure, per-component values and lock refs, LRUs and sizes,
//! and returns what the caller must free or rebuild ([`CacheAction`]).
//!
//! radixkv's lock-free [`crate::Cache`] names prefixes, not nodes, and holds u32 slots of one
//! pool; this tree keeps its own arena with SGLang's contract instead. **It is sequential**:
//! every method takes `&mut self` or `&self`, and the fronts serialize calls with one mutex
//! (SGLang's scheduler calls its tree core from one thread). It is `Send`.
//!
//! The state is per component where SGLang's is: FULL's value and lock ref on each node;
//! SWA's when the tree has a window (SGLang's `components/swa.py`: per-node SWA values and
//! window locks, tombstones, a match valid only where the SWA run back from its end covers
//! the window, a window-bounded SWA LRU, window locks whose boundary carries a stamp, the SWA
//! eviction walk from the LRU end); Mamba's when it has one (`components/mamba.py`: one state
//! per node where a sequence ended, a lock on the node alone, Mamba tombstones, an LRU and
//! eviction walk of its own, the per-path state cap).
//!
//! Ordering is SGLang's: a node's `last_access` is a counter that every touch, creation and
//! split advances by one, a match stamps its deepest valid node and each ancestor 1e-5
//! apart, and the eviction walk pops the evictable leaf with the oldest stamp first, then
//! offers the parent of the leaf it just evicted. So a replay evicts the same nodes, in the
//! same order, as SGLang's Python and Rust cores.
//!
//! Bad input (a missing node id: [`Error::NoNode`]; an unlock of an unlocked node, values
//! shorter than the key: [`Error::InvalidArgument`]; a walk step with no walk:
//! [`Error::NoWalk`]) is refused before anything changes.
//!
//! # A request's cycle on a sliding-window hybrid
//!
//! ```
//! use radixkv::hybrid::{CacheAction, Component, HybridOptions, HybridTree};
//!
//! // Page 1, a window of 4 tokens.
//! let mut t = HybridTree::new(HybridOptions { swa_window: 4, ..Default::default() })?;
//! let prompt: Vec<i64> = (0..10).collect();
//! // Match, then pin what matched (FULL path and SWA window) while the request runs.
//! let m = t.match_prefix(0, &prompt);
//! assert_eq!(m.device_prefix_len, 0);
//! let pin = t.inc_lock_ref(m.last_device_node)?;
//! assert_eq!(pin, 0); // nothing cached yet: the root
//! // The request's KV was written at FULL indices 100..110; cache it.
//! let kv: Vec<i64> = (100..110).collect();
//! let r = t.insert_swa(0, &prompt, Some(&kv), m.device_prefix_len, 0)?;
//! for a in &r.actions {
//!     match a {
//!         // The caller allocates SWA slots for the node's tokens, copies, and stores them
//!         // (here the FULL indices stand in for them).
//!         CacheAction::SwaRebuild { node, full } => t.swa_set_value(*node, full.clone())?,
//!         CacheAction::FreeDeviceKv(_) | CacheAction::FreeDeviceKvFullOnly(_) => {}
//!         CacheAction::RecoverSwaWithLockedFull { .. } => unreachable!("nothing is locked"),
//!     }
//! }
//! if !r.refreshed {
//!     t.swa_refresh(r.node)?;
//! }
//! t.dec_lock_ref(m.last_device_node)?;
//! // The next request with the same prompt hits it all.
//! assert_eq!(t.match_prefix(0, &prompt).device_prefix_len, 10);
//! // Short of SWA slots: evict 4 SWA tokens; every freed index is handed back.
//! let mut freed = Vec::new();
//! let n = t.evict(Component::Swa, 4, &mut freed)?;
//! assert!(n >= 4);
//! assert!(freed.iter().all(|f| !f.indices.is_empty()));
//! assert_eq!(t.check(), None);
//! # Ok::<(), radixkv::Error>(())
//! ```

use std::collections::{BinaryHeap, HashMap, HashSet};

use crate::error::{Error, Result};

mod evict;
mod inspect;
mod mamba;
mod swa;
mod tree;

#[cfg(test)]
mod tests;

pub use evict::{Component, Freed};
pub use inspect::{MambaInfo, NodeInfo, SwaInfo};
pub use mamba::MambaStep;
pub use swa::{SwaInsert, SwaStep};

/// A node's id: stable for the node's life (a split gives the new prefix node a fresh id),
/// never reused within a tree.
pub type NodeId = u64;

const NONE: u32 = u32::MAX;

/// A child's key: its namespace (SGLang's `extra_key`/`cache_salt` pair, numbered by the
/// caller) and its first page of tokens.
#[derive(Clone, PartialEq, Eq, Hash)]
enum ChildKey {
    One(u32, i64),
    Page(u32, Box<[i64]>),
}

fn child_key(ns: u32, page: &[i64]) -> ChildKey {
    if page.len() == 1 { ChildKey::One(ns, page[0]) } else { ChildKey::Page(ns, page.into()) }
}

/// One component's data on a node (SGLang's `ComponentData`): a device value and a lock.
#[derive(Default)]
struct Comp {
    value: Option<Vec<i64>>,
    lock_ref: u32,
}

struct Node {
    id: u64,
    parent: u32,
    ns: u32,
    key: Vec<i64>,
    full: Comp,
    /// SWA's value (the node's SWA pool indices; None: a tombstone) and window lock ref,
    /// used only when the tree has a sliding window.
    swa: Comp,
    /// SWA's window-lock boundary stamp (SGLang's `metadata["uuid"]`; 0: none).
    swa_uuid: u64,
    /// The SWA LRU list's links (toward the MRU end, toward the LRU end) and membership.
    lru_prev: u32,
    lru_next: u32,
    in_lru: bool,
    /// Mamba's state (the node's Mamba pool slot; None: none, or a tombstone) and lock ref,
    /// used only when the tree has a Mamba component; its LRU links and membership.
    mamba: Comp,
    mlru_prev: u32,
    mlru_next: u32,
    in_mlru: bool,
    last_access: f64,
    /// Children in insertion order (SGLang's dict order: DFS walks follow it); a removed
    /// child leaves `NONE` behind (`dead` of them) until the list is compacted, so that a
    /// removal is O(1) under a parent of many children (the root).
    children: Vec<u32>,
    dead: u32,
    /// This node's position in its parent's `children`.
    pos: u32,
    index: HashMap<ChildKey, u32>,
}

/// A cache action of SGLang's (`cache_action.py`) that an SWA insert emits, in order: what
/// the caller must do with its pools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheAction {
    /// `FreeDeviceKV`: free these indices in the FULL and the SWA pools.
    FreeDeviceKv(Vec<i64>),
    /// `FreeDeviceKVFullOnly`: free these indices in the FULL pool only.
    FreeDeviceKvFullOnly(Vec<i64>),
    /// `SWARebuild`: a barrier. Allocate SWA slots for `node`'s tokens (whose FULL indices
    /// are `full`), copy them, and store them with [`HybridTree::swa_set_value`] before the
    /// window refresh ([`HybridTree::swa_refresh`]).
    SwaRebuild {
        /// The node whose SWA value is to be rebuilt.
        node: NodeId,
        /// The node's FULL indices (the copy's source).
        full: Vec<i64>,
    },
    /// `RecoverSWAWithLockedFull`: a barrier. `node`'s FULL value is locked by another
    /// request (`kept`); recover its SWA value from the request's `incoming` indices.
    RecoverSwaWithLockedFull {
        /// The node.
        node: NodeId,
        /// The FULL indices the tree keeps.
        kept: Vec<i64>,
        /// The request's FULL indices for the same tokens.
        incoming: Vec<i64>,
    },
}

/// What a hybrid tree is made with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HybridOptions {
    /// Tokens per page (at least 1): keys are matched and inserted in whole pages.
    pub page_size: usize,
    /// The first node id handed out (the root's).
    pub first_id: NodeId,
    /// SGLang's `swa_retain_window`, in tokens: adds the SWA component; 0 none.
    pub swa_window: usize,
    /// Adds the Mamba component (one recurrent state per node).
    pub mamba: bool,
}

impl Default for HybridOptions {
    /// Page 1, ids from 1, FULL only.
    fn default() -> Self {
        HybridOptions { page_size: 1, first_id: 1, swa_window: 0, mamba: false }
    }
}

/// A match ([`HybridTree::match_prefix`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HybridMatch {
    /// Tokens matched with every component valid (SGLang's `device_indices` length).
    pub device_prefix_len: usize,
    /// The deepest node of that prefix (the root when 0).
    pub last_device_node: NodeId,
    /// Tokens whose FULL KV is on the device (SGLang's `full_kv_hit_length`), at least
    /// `device_prefix_len`.
    pub full_hit_len: usize,
    /// The last node the walk visited, when it visited one past the root.
    pub last_visited: Option<NodeId>,
}

/// A read-only FULL match ([`HybridTree::match_full_device_prefix`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FullMatch {
    /// Tokens matched.
    pub len: usize,
    /// The deepest node matched.
    pub node: NodeId,
    /// FULL tokens pinned on that node's path.
    pub pinned: usize,
}

/// An insert ([`HybridTree::insert`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HybridInsert {
    /// Tokens the tree already held (SGLang's `prefix_len`).
    pub prefix_len: usize,
    /// The node the key ends on (SGLang's `last_device_node`).
    pub node: NodeId,
    /// The request's indices past `prev_prefix_len` that the tree already held: the caller
    /// frees them (SGLang's `FreeDeviceKV`).
    pub duplicates: Vec<i64>,
}

/// `(evictable, protected)` sizes of one component: FULL and SWA in tokens, Mamba in states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sizes {
    /// Held by no lock.
    pub evictable: u64,
    /// Held by a lock.
    pub protected: u64,
}

#[derive(Default)]
struct Walk {
    request: u64,
    heap: BinaryHeap<Entry>,
    last: Option<(u32, u64)>,
    open: bool,
    /// The SWA walk's LRU cursor (slot, id) and request, when an SWA walk is open.
    swa_cursor: Option<(u32, u64)>,
    swa_request: u64,
    swa_open: bool,
    /// The Mamba walk's LRU cursor (slot, id) and request, when a Mamba walk is open.
    mamba_cursor: Option<(u32, u64)>,
    mamba_request: u64,
    mamba_open: bool,
}

/// A heap entry: the oldest stamp first (`BinaryHeap` is a max-heap, so reversed).
#[derive(PartialEq)]
struct Entry(f64, u32, u64);

impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.0.total_cmp(&self.0)
    }
}
struct Tree {
    page: usize,
    nodes: Vec<Option<Node>>,
    free: Vec<u32>,
    ids: HashMap<u64, u32>,
    next_id: u64,
    clock: f64,
    root: u32,
    evictable: u64,
    protected: u64,
    leaves: HashSet<u32>,
    walk: Walk,
    /// SGLang's `swa_retain_window` (0: no SWA component).
    window: usize,
    swa_evictable: u64,
    swa_protected: u64,
    next_uuid: u64,
    /// The SWA LRU list's MRU and LRU ends (`NONE` when empty).
    lru_head: u32,
    lru_tail: u32,
    /// Whether the tree has a Mamba component, its `(evictable, protected)` states, and its
    /// LRU list's MRU and LRU ends.
    mamba: bool,
    mamba_evictable: u64,
    mamba_protected: u64,
    mlru_head: u32,
    mlru_tail: u32,
    /// Key and value buffers of evicted leaves, for the next new leaf: a long request's
    /// buffers are large enough for the allocator to map and unmap them afresh each time
    /// (and fault every page in again), which costs more than the copy.
    spare: Vec<Vec<i64>>,
}

/// How many spare buffers a tree keeps, and the smallest worth keeping (in values).
const SPARE_MAX: usize = 32;
const SPARE_MIN: usize = 1024;

/// SGLang's tree core for `[FULL]`, `[FULL, SWA]`, `[FULL, MAMBA]` and `[FULL, SWA, MAMBA]`
/// (see the module docs). Sequential: the caller serializes calls.
pub struct HybridTree {
    t: Tree,
}

impl std::fmt::Debug for HybridTree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridTree")
            .field("page_size", &self.t.page)
            .field("swa_window", &self.t.window)
            .field("mamba", &self.t.mamba)
            .field("nodes", &self.t.ids.len())
            .finish()
    }
}

impl HybridTree {
    /// A tree of `opts.page_size`-token pages with the components `opts` names. Refused
    /// ([`Error::InvalidArgument`]) for a page size of 0.
    pub fn new(opts: HybridOptions) -> Result<HybridTree> {
        if opts.page_size == 0 {
            return Err(Error::InvalidArgument("page_size must be at least 1, got 0".into()));
        }
        Ok(HybridTree { t: Tree::new(opts.page_size, opts.first_id, opts.swa_window, opts.mamba) })
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.t.page
    }

    /// The SWA window in tokens (0: no SWA component).
    pub fn swa_window(&self) -> usize {
        self.t.window
    }

    /// Whether the tree has a Mamba component.
    pub fn has_mamba(&self) -> bool {
        self.t.mamba
    }

    /// The root's id.
    pub fn root(&self) -> NodeId {
        self.t.n(self.t.root).id
    }

    /// Drops every node; the new root gets a fresh id.
    pub fn reset(&mut self) {
        self.t.reset();
    }

    /// Matches `key` in namespace `ns` (SGLang's `match_prefix`): splits the node the match
    /// ends inside, and stamps the matched path (its deepest valid node most recent).
    pub fn match_prefix(&mut self, ns: u32, key: &[i64]) -> HybridMatch {
        let t = &mut self.t;
        let (m, best, hit, last) = t.match_walk(ns, key);
        HybridMatch {
            device_prefix_len: m,
            last_device_node: t.n(best).id,
            full_hit_len: hit,
            last_visited: (last != NONE).then(|| t.n(last).id),
        }
    }

    /// The FULL match of `key`, read-only: no split, no stamp.
    pub fn match_full_device_prefix(&self, ns: u32, key: &[i64]) -> FullMatch {
        let (len, n, pinned) = self.t.match_read(ns, key);
        FullMatch { len, node: self.t.n(n).id, pinned }
    }

    /// Refuses an insert whose values do not cover its page-aligned tokens.
    fn check_values(&self, key_len: usize, vals_len: usize) -> Result<()> {
        let aligned = key_len / self.t.page * self.t.page;
        if vals_len < aligned {
            return Err(Error::InvalidArgument(format!(
                "insert: values has {vals_len} indices for {aligned} (page-aligned) tokens; nothing was inserted"
            )));
        }
        Ok(())
    }

    /// Inserts `key`'s whole pages -> `values` (`None`: the tokens themselves, as SGLang
    /// does) with FULL's rules; `prev_prefix_len` is the request's prefix that it already
    /// holds from the tree (its match), so only duplicates past it are handed back to free.
    /// On a tree with a window, [`HybridTree::insert_swa`] is the insert to use.
    pub fn insert(
        &mut self,
        ns: u32,
        key: &[i64],
        values: Option<&[i64]>,
        prev_prefix_len: usize,
    ) -> Result<HybridInsert> {
        let vals = values.unwrap_or(key);
        self.check_values(key.len(), vals.len())?;
        let t = &mut self.t;
        let (prefix_len, node, duplicates) = t.insert(ns, key, vals, prev_prefix_len);
        Ok(HybridInsert { prefix_len, node: t.n(node).id, duplicates })
    }

    /// Locks `node`'s root path (SGLang's `inc_lock_ref` on FULL); returns the tokens that
    /// became protected.
    pub fn inc_lock_ref(&mut self, node: NodeId) -> Result<u64> {
        let s = self.t.slot(node)?;
        Ok(self.t.lock(s))
    }

    /// Releases a lock taken by [`HybridTree::inc_lock_ref`]; returns the tokens that
    /// became evictable. Refused, with nothing changed, where the path is not locked.
    pub fn dec_lock_ref(&mut self, node: NodeId) -> Result<u64> {
        let s = self.t.slot(node)?;
        self.t.unlock(s)
    }

    /// FULL's sizes, in tokens.
    pub fn sizes(&self) -> Sizes {
        Sizes { evictable: self.t.evictable, protected: self.t.protected }
    }

    /// Starts an eviction walk for `request` tokens: the evictable leaves, oldest first.
    pub fn evict_start(&mut self, request: u64) {
        let t = &mut self.t;
        let heap: BinaryHeap<Entry> =
            t.leaves.iter().map(|&s| Entry(t.n(s).last_access, s, t.n(s).id)).collect();
        t.walk.request = request;
        t.walk.heap = heap;
        t.walk.last = None;
        t.walk.open = true;
    }

    /// The walk's next victim, `evicted` tokens evicted so far: `None` when done
    /// (`evicted` reached the request, or no leaf is left). The caller evicts it
    /// ([`HybridTree::evict_leaf`]) or skips it.
    pub fn evict_next(&mut self, evicted: u64) -> Result<Option<NodeId>> {
        let t = &mut self.t;
        if !t.walk.open {
            return Err(Error::NoWalk { walk: "FULL" });
        }
        if let Some((s, _)) = t.walk.last.take() {
            // The parent of the leaf just evicted, if it became a leaf.
            if s != NONE && t.leaves.contains(&s) {
                let e = Entry(t.n(s).last_access, s, t.n(s).id);
                t.walk.heap.push(e);
            }
        }
        while evicted < t.walk.request {
            let Some(Entry(_, s, id)) = t.walk.heap.pop() else { break };
            let live = t.nodes.get(s as usize).and_then(|n| n.as_ref()).is_some_and(|n| n.id == id);
            if !live || !t.leaves.contains(&s) {
                continue;
            }
            t.walk.last = Some((NONE, id));
            return Ok(Some(id));
        }
        Ok(None)
    }

    /// Evicts a device leaf (deletes it: this tree keeps no host copy); returns its FULL
    /// device indices for the allocator (hand the vector back with
    /// [`HybridTree::recycle`] once read, to spare the next leaf an allocation). Refused
    /// for a locked node, the root, or a node with children.
    pub fn evict_leaf(&mut self, node: NodeId) -> Result<Vec<i64>> {
        let t = &mut self.t;
        let s = t.slot(node)?;
        if !t.is_leaf(s) {
            return Err(Error::InvalidArgument(format!(
                "evict_device_leaf: node {node} is not an evictable device leaf (locked, the \
                 root, or has children on the device); nothing was changed"
            )));
        }
        let parent = t.n(s).parent;
        let v = t.remove_leaf(s);
        if t.walk.open {
            t.walk.last = Some((parent, 0));
        }
        Ok(v)
    }

    /// Takes back a vector [`HybridTree::evict_leaf`] handed out, for a later leaf's value.
    pub fn recycle(&mut self, v: Vec<i64>) {
        self.t.give_back(v);
    }

    /// Ends the eviction walk.
    pub fn evict_end(&mut self) {
        let t = &mut self.t;
        t.walk.heap = BinaryHeap::new();
        t.walk.last = None;
        t.walk.open = false;
    }

    /// The FULL device indices from `from` up to, not including, `until` (an ancestor), in
    /// root order, as the nodes' slices (borrowed: concatenate them).
    pub fn collect_indices(&self, from: NodeId, until: NodeId) -> Result<Vec<&[i64]>> {
        let t = &self.t;
        let mut s = t.slot(from)?;
        let until_s = t.slot(until)?;
        let mut chunks = Vec::new();
        while s != until_s {
            if s == NONE || s == t.root {
                return Err(Error::InvalidArgument(format!(
                    "collect_full_device_indices: node {until} is not an ancestor of node {from}"
                )));
            }
            let Some(v) = t.n(s).full.value.as_ref() else {
                return Err(Error::InvalidArgument(format!(
                    "collect_full_device_indices: node {} on the path has no device value",
                    t.n(s).id
                )));
            };
            chunks.push(v.as_slice());
            s = t.n(s).parent;
        }
        chunks.reverse();
        Ok(chunks)
    }
}
