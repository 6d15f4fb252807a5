//! `radixkv._radixkv.NativeTreeCore`: the tree of SGLang's `UnifiedRadixCache` for the
//! component sets `[FULL]` and `[FULL, SWA]` (`swa_window > 0`), one native call per
//! interface call (the Python adapter is `radixkv/_sglang_tree_core.py`).
//!
//! SGLang's tree-core contract is node-shaped: the controller holds node ids across calls
//! (a match's `last_device_node`, a lock's anchor, an eviction step's victim), a match or an
//! insert that ends inside a node splits it (the new node is the prefix, the old id stays
//! with the suffix), values are the allocator's int64 device indices, and the eviction walk
//! is driven one leaf at a time by the controller. radixkv's lock-free core (`radixkv::Cache`)
//! names prefixes, not nodes, and holds u32 slots, so this class keeps its own
//! single-threaded arena tree with that contract: every call runs under one mutex (SGLang's
//! scheduler calls its tree core from one thread). The state is per component where SGLang's
//! is (`Comp`): FULL's, and SWA's when the tree has a window (SGLang's `components/swa.py`:
//! per-node SWA values and window locks, tombstones, a match valid only where the SWA run
//! back from its end covers the window, a window-bounded SWA LRU as a linked list through
//! the nodes, window locks whose boundary carries a stamp, the SWA eviction walk from the
//! LRU end). Mamba is not here yet.
//!
//! Ordering is SGLang's: a node's `last_access` is a counter that every touch, creation and
//! split advances by one, a match stamps its deepest valid node and each ancestor 1e-5 apart,
//! and the eviction walk pops the evictable leaf with the oldest stamp first, then offers the
//! parent of the leaf it just evicted. So a replay evicts the same nodes, in the same order,
//! as SGLang's Python and Rust cores.
//!
//! Bad input (a missing node id, an unlock of an unlocked node, values shorter than the key)
//! is refused with an error before anything changes.
//!
//! The GIL is held throughout every call (no `Python::detach`): the mutex is only ever taken
//! with the GIL held, so two threads cannot each hold one and wait for the other, and the
//! request's key and values are read in place (`to_input64_held`) while no Python code runs.

use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Mutex;

use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyList};

use crate::input::{Input64, to_input64_held};

const NONE: u32 = u32::MAX;

/// A child's key: its namespace (SGLang's `extra_key`/`cache_salt` pair, numbered by the
/// adapter) and its first page of tokens.
#[derive(Clone, PartialEq, Eq, Hash)]
enum ChildKey {
    One(u32, i64),
    Page(u32, Box<[i64]>),
}

fn child_key(ns: u32, page: &[i64]) -> ChildKey {
    if page.len() == 1 { ChildKey::One(ns, page[0]) } else { ChildKey::Page(ns, page.into()) }
}

/// One component's data on a node (SGLang's `ComponentData`): FULL's device value and lock.
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

/// A cache action of SGLang's (`cache_action.py`) that an SWA insert emits, in order.
enum Act {
    /// `FreeDeviceKV`: FULL and SWA slots.
    Free(Vec<i64>),
    /// `FreeDeviceKVFullOnly`.
    FreeFullOnly(Vec<i64>),
    /// `SWARebuild(node, source FULL value)`: a barrier.
    Rebuild(u64, Vec<i64>),
    /// `RecoverSWAWithLockedFull(node, kept FULL, incoming FULL)`: a barrier.
    RecoverLocked(u64, Vec<i64>, Vec<i64>),
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
    /// Key and value buffers of evicted leaves, for the next new leaf: a long request's
    /// buffers are large enough for the allocator to map and unmap them afresh each time
    /// (and fault every page in again), which costs more than the copy.
    spare: Vec<Vec<i64>>,
}

/// How many spare buffers a tree keeps, and the smallest worth keeping (in values).
const SPARE_MAX: usize = 32;
const SPARE_MIN: usize = 1024;

fn missing(id: u64) -> PyErr {
    PyKeyError::new_err(format!("node id {id} is not in this tree core (evicted, or never made)"))
}

impl Tree {
    fn new(page: usize, first_id: u64, window: usize) -> Tree {
        let mut t = Tree {
            page,
            nodes: Vec::new(),
            free: Vec::new(),
            ids: HashMap::new(),
            next_id: first_id,
            clock: 0.0,
            root: NONE,
            evictable: 0,
            protected: 0,
            leaves: HashSet::new(),
            walk: Walk::default(),
            window,
            swa_evictable: 0,
            swa_protected: 0,
            next_uuid: 1,
            lru_head: NONE,
            lru_tail: NONE,
            spare: Vec::new(),
        };
        let root = t.alloc(NONE, 0, Vec::new(), Some(Vec::new()));
        t.n_mut(root).full.lock_ref = 1;
        t.root = root;
        t
    }

    fn tick(&mut self) -> f64 {
        let t = self.clock;
        self.clock += 1.0;
        t
    }

    fn alloc(&mut self, parent: u32, ns: u32, key: Vec<i64>, value: Option<Vec<i64>>) -> u32 {
        let last_access = self.tick();
        self.tick(); // SGLang's node also stamps its creation time
        let id = self.next_id;
        self.next_id += 1;
        let node = Node {
            id,
            parent,
            ns,
            key,
            full: Comp { value, lock_ref: 0 },
            swa: Comp::default(),
            swa_uuid: 0,
            lru_prev: NONE,
            lru_next: NONE,
            in_lru: false,
            last_access,
            children: Vec::new(),
            dead: 0,
            pos: 0,
            index: HashMap::new(),
        };
        let slot = match self.free.pop() {
            Some(s) => {
                self.nodes[s as usize] = Some(node);
                s
            }
            None => {
                self.nodes.push(Some(node));
                (self.nodes.len() - 1) as u32
            }
        };
        self.ids.insert(id, slot);
        slot
    }

    fn n(&self, s: u32) -> &Node {
        self.nodes[s as usize].as_ref().expect("live slot")
    }

    fn n_mut(&mut self, s: u32) -> &mut Node {
        self.nodes[s as usize].as_mut().expect("live slot")
    }

    fn slot(&self, id: u64) -> PyResult<u32> {
        self.ids.get(&id).copied().ok_or_else(|| missing(id))
    }

    /// Node `s`'s live children, in order.
    fn kids(&self, s: u32) -> impl DoubleEndedIterator<Item = u32> + '_ {
        self.n(s).children.iter().copied().filter(|&c| c != NONE)
    }

    fn kid_count(&self, s: u32) -> usize {
        let n = self.n(s);
        n.children.len() - n.dead as usize
    }

    fn add_kid(&mut self, parent: u32, child: u32) {
        let pos = self.n(parent).children.len() as u32;
        self.n_mut(parent).children.push(child);
        self.n_mut(child).pos = pos;
    }

    fn vlen(&self, s: u32) -> u64 {
        self.n(s).full.value.as_ref().map_or(0, |v| v.len() as u64)
    }

    /// SGLang's D-leaf: not the root, a device value, unlocked, no child with a device value.
    fn is_leaf(&self, s: u32) -> bool {
        let n = self.n(s);
        s != self.root
            && n.full.value.is_some()
            && n.full.lock_ref == 0
            && n.swa.lock_ref == 0
            && self.kids(s).all(|c| self.n(c).full.value.is_none())
    }

    fn refresh_leaf(&mut self, s: u32) {
        if s == NONE {
            return;
        }
        if self.is_leaf(s) {
            self.leaves.insert(s);
        } else {
            self.leaves.remove(&s);
        }
    }

    fn child(&self, s: u32, ns: u32, page: &[i64]) -> Option<u32> {
        self.n(s).index.get(&child_key(ns, page)).copied()
    }

    /// The page-rounded common prefix of node `s`'s key and `key`.
    fn common(&self, s: u32, key: &[i64]) -> usize {
        let k = &self.n(s).key;
        let n = k.len().min(key.len());
        // Whole 32-token blocks compared as slices (a memcmp), then token by token.
        let mut i = 0;
        while i + 32 <= n && k[i..i + 32] == key[i..i + 32] {
            i += 32;
        }
        while i < n && k[i] == key[i] {
            i += 1;
        }
        i / self.page * self.page
    }

    /// Splits node `s` after `at` tokens: a new node takes the prefix (and `s`'s place under
    /// its parent), `s` keeps its id and the suffix. Returns the new node.
    fn split(&mut self, s: u32, at: usize) -> u32 {
        let (parent, ns, prefix, pre_val, lock_ref, pre_swa, swa_lock, uuid) = {
            let n = self.n_mut(s);
            let suffix = n.key.split_off(at);
            let prefix = std::mem::replace(&mut n.key, suffix);
            let pre_val = n.full.value.as_mut().map(|v| {
                let rest = v.split_off(at);
                std::mem::replace(v, rest)
            });
            // SGLang's SWA `redistribute_on_node_split`: the prefix takes its part of the
            // value, the lock ref, and the window boundary stamp (the node's older edge).
            let pre_swa = n.swa.value.as_mut().map(|v| {
                let rest = v.split_off(at);
                std::mem::replace(v, rest)
            });
            let uuid = std::mem::take(&mut n.swa_uuid);
            (n.parent, n.ns, prefix, pre_val, n.full.lock_ref, pre_swa, n.swa.lock_ref, uuid)
        };
        let first = child_key(ns, &prefix[..self.page]);
        let new = self.alloc(parent, ns, prefix, pre_val);
        let page = self.page;
        let suffix_key = child_key(ns, &self.n(s).key[..page]);
        let pos = self.n(s).pos;
        {
            let nn = self.n_mut(new);
            nn.full.lock_ref = lock_ref;
            nn.swa = Comp { value: pre_swa, lock_ref: swa_lock };
            nn.swa_uuid = uuid;
            nn.index.insert(suffix_key, s);
            nn.pos = pos;
        }
        self.add_kid(new, s);
        self.n_mut(s).parent = new;
        {
            let p = self.n_mut(parent);
            p.children[pos as usize] = new;
            p.index.insert(first, new);
        }
        // The prefix's SWA data goes just behind the suffix in the SWA LRU.
        if self.n(new).swa.value.is_some() {
            self.lru_insert_after(s, new);
        }
        let t = self.tick();
        self.n_mut(s).last_access = t;
        self.refresh_leaf(new);
        self.refresh_leaf(s);
        new
    }

    /// The match walk (SGLang's `_match_prefix_helper` for FULL on the device): returns
    /// (matched tokens, deepest node, tokens walked, deepest node walked or NONE).
    fn match_walk(&mut self, ns: u32, key: &[i64]) -> (usize, u32, usize, u32) {
        let page = self.page;
        let key = &key[..key.len() / page * page];
        let mut node = self.root;
        let mut off = 0;
        let mut matched = 0;
        let mut best = self.root;
        let mut best_len = 0;
        // SWA's validator (SGLang's `create_match_validator`, gating the prefix match): a
        // node is a valid match end only where the run of SWA-valued nodes back from it
        // covers the window; a tombstone restarts the run. Without SWA every node is valid.
        let window = self.window;
        let mut run = usize::MAX;
        while off < key.len() {
            let Some(c) = self.child(node, ns, &key[off..off + page]) else { break };
            if self.n(c).full.value.is_none() {
                break;
            }
            let p = self.common(c, &key[off..]);
            let split = p < self.n(c).key.len();
            let c = if split { self.split(c, p) } else { c };
            matched += p;
            node = c;
            let valid = window == 0 || {
                if self.n(c).swa.value.is_none() {
                    run = 0;
                    false
                } else {
                    run = run.saturating_add(self.n(c).key.len());
                    run >= window
                }
            };
            if valid {
                best = c;
                best_len = matched;
            }
            if split {
                break;
            }
            off += p;
        }
        if window > 0 {
            self.swa_refresh(best);
        }
        // Stamp the best node and its ancestors, the deepest newest.
        let mut t = self.tick();
        let mut u = best;
        while u != NONE {
            let n = self.n_mut(u);
            n.last_access = t;
            t -= 0.00001;
            u = n.parent;
        }
        (best_len, best, matched, if node == self.root { NONE } else { node })
    }

    /// SGLang's `match_full_device_prefix`: read-only, no split, no stamp.
    fn match_read(&self, ns: u32, key: &[i64]) -> (usize, u32, usize) {
        let page = self.page;
        let key = &key[..key.len() / page * page];
        let mut node = self.root;
        let (mut off, mut pinned) = (0, 0);
        while off < key.len() {
            let Some(c) = self.child(node, ns, &key[off..off + page]) else { break };
            if self.n(c).full.value.is_none() {
                break;
            }
            let p = self.common(c, &key[off..]);
            if p == 0 {
                break;
            }
            off += p;
            node = c;
            pinned += self.n(c).key.len();
            if p < self.n(c).key.len() {
                break;
            }
        }
        (off, node, pinned)
    }

    /// The whole FULL insert (every action FULL emits is deferrable, so SGLang's step-wise
    /// insert runs to completion in one step). Returns (prefix length, target node, the
    /// request's duplicate indices to free).
    fn insert(
        &mut self,
        ns: u32,
        key: &[i64],
        value: &[i64],
        prev_prefix_len: usize,
    ) -> (usize, u32, Vec<i64>) {
        let mut acts = Vec::new();
        let (p, node, frees) = self.insert_with(ns, key, value, prev_prefix_len, 0, &mut acts);
        debug_assert!(acts.is_empty());
        (p, node, frees)
    }

    /// The insert with the SWA rules (`swa_start`: the request's SWA-evicted prefix,
    /// page-aligned): SWA's cache actions go to `acts`, in SGLang's order; FULL's duplicate
    /// frees are returned when `acts` gets none of them (always without SWA).
    fn insert_with(
        &mut self,
        ns: u32,
        key: &[i64],
        value: &[i64],
        prev_prefix_len: usize,
        swa_start: usize,
        acts: &mut Vec<Act>,
    ) -> (usize, u32, Vec<i64>) {
        let swa = self.window > 0;
        let page = self.page;
        let len = key.len() / page * page;
        let (key, value) = (&key[..len], &value[..len]);
        let root = self.root;
        let t = self.tick();
        self.n_mut(root).last_access = t;
        let mut frees = Vec::new();
        if len == 0 {
            return (0, root, frees);
        }
        let mut node = root;
        let mut total = 0;
        while total < len {
            let Some(mut c) = self.child(node, ns, &key[total..total + page]) else { break };
            let t = self.tick();
            self.n_mut(c).last_access = t;
            let p = self.common(c, &key[total..]);
            if p < self.n(c).key.len() {
                c = self.split(c, p);
            }
            if self.n(c).full.value.is_none() {
                // An evicted node (kept only by a host copy, which this core never makes):
                // restore it from the request's KV.
                let v = value[total..total + p].to_vec();
                let locked = self.n(c).full.lock_ref > 0;
                self.n_mut(c).full.value = Some(v);
                if locked {
                    self.protected += p as u64
                } else {
                    self.evictable += p as u64
                }
                self.refresh_leaf(c);
                let par = self.n(c).parent;
                self.refresh_leaf(par);
            } else if !swa {
                let dup_start = prev_prefix_len.saturating_sub(total);
                if dup_start < p {
                    frees.extend_from_slice(&value[total + dup_start..total + p]);
                }
            } else {
                // SGLang's SWA `update_component_on_insert_overlap`: an SWA tombstone inside
                // the request's live window takes the request's KV back.
                let mut consumed = p;
                if prev_prefix_len < total + p && self.n(c).swa.value.is_none() {
                    let live = total.max(swa_start);
                    if live < total + p {
                        if live > total {
                            self.split(c, live - total);
                        }
                        let incoming = value[live..total + p].to_vec();
                        let old = self.n(c).full.value.clone().unwrap_or_default();
                        if self.n(c).full.lock_ref > 0 {
                            acts.push(Act::RecoverLocked(self.n(c).id, old, incoming));
                        } else {
                            self.n_mut(c).full.value = Some(incoming.clone());
                            acts.push(Act::FreeFullOnly(old));
                            acts.push(Act::Rebuild(self.n(c).id, incoming));
                        }
                        consumed = live - total;
                    }
                }
                let dup_start = prev_prefix_len.saturating_sub(total);
                if dup_start < consumed {
                    let dup = &value[total + dup_start..total + consumed];
                    let gone = swa_start.saturating_sub(total + dup_start).min(dup.len());
                    if gone > 0 {
                        acts.push(Act::FreeFullOnly(dup[..gone].to_vec()));
                    }
                    if gone < dup.len() {
                        acts.push(Act::Free(dup[gone..].to_vec()));
                    }
                }
            }
            node = c;
            total += p;
        }
        let target = if total < len {
            let (k, v) = (self.buf_of(&key[total..]), self.buf_of(&value[total..]));
            let new = self.alloc(node, ns, k, Some(v));
            let k = child_key(ns, &key[total..total + page]);
            self.n_mut(node).index.insert(k, new);
            self.add_kid(node, new);
            self.evictable += (len - total) as u64;
            self.refresh_leaf(new);
            self.refresh_leaf(node);
            if swa {
                self.swa_populate_leaf(new, total, len, swa_start, acts);
            }
            new
        } else {
            node
        };
        (total, target, frees)
    }

    /// SGLang's SWA `commit_insert_component_data` for a new leaf spanning [start, end):
    /// the part past `swa_start` gets SWA values (the cache's `SWARebuild`), the leaf capped
    /// at one page-aligned window (its older part split off as a parent, published first).
    fn swa_populate_leaf(
        &mut self,
        leaf: u32,
        start: usize,
        end: usize,
        swa_start: usize,
        acts: &mut Vec<Act>,
    ) {
        let live = start.max(swa_start);
        if live >= end {
            return;
        }
        if live > start {
            self.split(leaf, live - start);
        }
        let tail = self.window.div_ceil(self.page) * self.page;
        let len = self.n(leaf).key.len();
        let mut parent = NONE;
        if self.n(leaf).swa.lock_ref == 0 && len > tail {
            let at = len - tail;
            if self.page == 1 || (at.is_multiple_of(self.page) && len.is_multiple_of(self.page)) {
                parent = self.split(leaf, at);
            }
        }
        for u in [parent, leaf] {
            if u != NONE {
                let v = self.n(u).full.value.clone().unwrap_or_default();
                acts.push(Act::Rebuild(self.n(u).id, v));
            }
        }
    }

    fn path_to_root(&self, s: u32) -> Vec<u32> {
        let mut v = Vec::new();
        let mut u = s;
        while u != self.root && u != NONE {
            v.push(u);
            u = self.n(u).parent;
        }
        v
    }

    fn lock(&mut self, s: u32) -> u64 {
        let mut delta = 0;
        for u in self.path_to_root(s) {
            let len = self.vlen(u);
            let has = self.n(u).full.value.is_some();
            let n = self.n_mut(u);
            if n.full.lock_ref == 0 && has {
                delta += len;
            }
            n.full.lock_ref += 1;
            self.leaves.remove(&u);
        }
        self.evictable -= delta;
        self.protected += delta;
        delta
    }

    fn unlock(&mut self, s: u32) -> PyResult<u64> {
        let path = self.path_to_root(s);
        if let Some(&u) = path.iter().find(|&&u| self.n(u).full.lock_ref == 0) {
            return Err(PyValueError::new_err(format!(
                "dec_lock_ref: node {} on the path of node {} has lock_ref 0 (released more \
                 often than locked); nothing was changed",
                self.n(u).id,
                self.n(s).id
            )));
        }
        let mut delta = 0;
        for u in path {
            let len = self.vlen(u);
            let n = self.n_mut(u);
            if n.full.lock_ref == 1 && n.full.value.is_some() {
                delta += len;
            }
            n.full.lock_ref -= 1;
            if n.full.lock_ref == 0 {
                self.refresh_leaf(u);
            }
        }
        self.evictable += delta;
        self.protected -= delta;
        Ok(delta)
    }

    /// A copy of `src` in a spare buffer that fits (not over 4x its size), else a new one.
    fn buf_of(&mut self, src: &[i64]) -> Vec<i64> {
        let n = src.len();
        let fits = |b: &Vec<i64>| b.capacity() >= n && b.capacity() <= 4 * n;
        if let Some(i) = self.spare.iter().position(fits).filter(|_| n >= SPARE_MIN) {
            let mut b = self.spare.swap_remove(i);
            b.clear();
            b.extend_from_slice(src);
            return b;
        }
        src.to_vec()
    }

    fn give_back(&mut self, b: Vec<i64>) {
        if b.capacity() >= SPARE_MIN && self.spare.len() < SPARE_MAX {
            self.spare.push(b);
        }
    }

    fn remove_leaf(&mut self, s: u32) -> Vec<i64> {
        // Its SWA data goes with it (the caller reads `swa_len` first to free it).
        if self.n(s).swa.value.is_some() {
            self.lru_remove(s);
            let len = self.n(s).swa.value.as_ref().map_or(0, |v| v.len() as u64);
            self.swa_evictable -= len;
        }
        let n = self.nodes[s as usize].take().expect("live slot");
        self.free.push(s);
        self.ids.remove(&n.id);
        self.leaves.remove(&s);
        let k = child_key(n.ns, &n.key[..self.page]);
        let p = self.n_mut(n.parent);
        p.index.remove(&k);
        let pos = n.pos as usize;
        p.children[pos] = NONE;
        p.dead += 1;
        if p.dead as usize * 2 > p.children.len() {
            p.children.retain(|&c| c != NONE);
            p.dead = 0;
            let kids = p.children.clone();
            for (i, c) in kids.into_iter().enumerate() {
                self.n_mut(c).pos = i as u32;
            }
        }
        let v = n.full.value.unwrap_or_default();
        self.evictable -= v.len() as u64;
        let parent = n.parent;
        self.refresh_leaf(parent);
        self.give_back(n.key);
        v
    }

    fn reset(&mut self) {
        let first = self.next_id;
        *self = Tree::new(self.page, first, self.window);
    }

    // ---- SWA (SGLang's `components/swa.py`) ----

    fn swa_len(&self, s: u32) -> u64 {
        self.n(s).swa.value.as_ref().map_or(0, |v| v.len() as u64)
    }

    /// Links `s` just after `prev` (toward the LRU end); `prev == NONE`: at the MRU end.
    fn lru_insert_after(&mut self, prev: u32, s: u32) {
        debug_assert!(!self.n(s).in_lru);
        let next = if prev == NONE { self.lru_head } else { self.n(prev).lru_next };
        {
            let n = self.n_mut(s);
            n.lru_prev = prev;
            n.lru_next = next;
            n.in_lru = true;
        }
        if prev == NONE {
            self.lru_head = s
        } else {
            self.n_mut(prev).lru_next = s
        }
        if next == NONE { self.lru_tail = s } else { self.n_mut(next).lru_prev = s }
    }

    fn lru_remove(&mut self, s: u32) {
        if !self.n(s).in_lru {
            return;
        }
        let (prev, next) = {
            let n = self.n_mut(s);
            n.in_lru = false;
            (std::mem::replace(&mut n.lru_prev, NONE), std::mem::replace(&mut n.lru_next, NONE))
        };
        if prev == NONE {
            self.lru_head = next
        } else {
            self.n_mut(prev).lru_next = next
        }
        if next == NONE { self.lru_tail = prev } else { self.n_mut(next).lru_prev = prev }
    }

    /// SGLang's `reset_node_and_window_ancestors_mru`: `s` and its ancestors within the
    /// window plus one page become the most recent, `s` first, in path order.
    fn swa_refresh(&mut self, s: u32) {
        let limit = self.window + self.page;
        let (mut acc, mut prev, mut u) = (0usize, NONE, s);
        while u != self.root && u != NONE && acc < limit {
            if self.n(u).swa.value.is_some() {
                self.lru_remove(u);
                self.lru_insert_after(prev, u);
                prev = u;
            }
            acc += self.n(u).key.len();
            u = self.n(u).parent;
        }
    }

    /// SGLang's SWA `acquire_component_lock`: every node of the segment covering the window
    /// back from `s` (tombstones included) gains a window lock; returns the boundary's
    /// stamp (0: the segment reached the root).
    fn swa_lock(&mut self, s: u32) -> u64 {
        let (mut covered, mut uuid, mut u) = (0usize, 0u64, s);
        while u != self.root && covered < self.window {
            let len = self.swa_len(u);
            let n = self.n_mut(u);
            if n.swa.lock_ref == 0 && n.swa.value.is_some() {
                self.swa_evictable -= len;
                self.swa_protected += len;
            }
            let (window, next) = (self.window, self.next_uuid);
            let n = self.n_mut(u);
            n.swa.lock_ref += 1;
            covered += n.key.len();
            if covered >= window {
                if n.swa_uuid == 0 {
                    n.swa_uuid = next;
                    self.next_uuid += 1;
                }
                uuid = self.n(u).swa_uuid;
            }
            self.refresh_leaf(u);
            u = self.n(u).parent;
        }
        uuid
    }

    /// The segment a window lock with stamp `uuid` holds, from `s` (up to the node stamped
    /// `uuid`, or to the root when 0); an error, naming the node, where one is unlocked.
    fn swa_segment(&self, s: u32, uuid: u64, what: &str) -> PyResult<Vec<u32>> {
        let mut seg = Vec::new();
        let mut u = s;
        while u != self.root {
            let n = self.n(u);
            if n.swa.lock_ref == 0 {
                return Err(PyValueError::new_err(format!(
                    "{what}: node {} in the SWA window segment of node {} has no window lock                      (released more often than locked); nothing was changed",
                    n.id,
                    self.n(s).id
                )));
            }
            seg.push(u);
            if uuid != 0 && n.swa_uuid == uuid {
                break;
            }
            u = n.parent;
        }
        Ok(seg)
    }

    /// SGLang's SWA `release_component_lock` (with `early`: `release_window_lock`, where an
    /// SWA value whose last lock goes on a device leaf is evicted at once; its FULL indices
    /// are returned to free). Checked in full before anything changes.
    fn swa_unlock(&mut self, s: u32, uuid: u64, early: bool) -> PyResult<Vec<i64>> {
        let seg =
            self.swa_segment(s, uuid, if early { "dec_swa_lock_only" } else { "dec_lock_ref" })?;
        let mut frees = Vec::new();
        for u in seg {
            let len = self.swa_len(u);
            let n = self.n_mut(u);
            n.swa.lock_ref -= 1;
            let freed = n.swa.lock_ref == 0;
            if freed && n.swa.value.is_some() {
                self.swa_evictable += len;
                self.swa_protected -= len;
            }
            if freed {
                self.refresh_leaf(u);
                if early && self.n(u).swa.value.is_some() && self.is_leaf(u) {
                    frees.extend_from_slice(self.n(u).full.value.as_deref().unwrap_or(&[]));
                    self.swa_tombstone(u);
                }
            }
        }
        Ok(frees)
    }

    /// Drops node `s`'s SWA value (a tombstone: its FULL value stays).
    fn swa_tombstone(&mut self, s: u32) -> u64 {
        let len = self.swa_len(s);
        self.lru_remove(s);
        let n = self.n_mut(s);
        n.swa.value = None;
        if n.swa.lock_ref > 0 {
            self.swa_protected -= len
        } else {
            self.swa_evictable -= len
        }
        self.refresh_leaf(s);
        len
    }

    /// SGLang's `set_component_device_value` for SWA: the value becomes the most recent.
    fn swa_set(&mut self, s: u32, value: Vec<i64>) -> PyResult<()> {
        let n = self.n(s);
        if s == self.root || n.swa.value.is_some() || value.len() != n.key.len() {
            return Err(PyValueError::new_err(format!(
                "set_component_device_value: node {} {}; nothing was changed",
                n.id,
                if s == self.root {
                    "is the root".to_string()
                } else if n.swa.value.is_some() {
                    "already has an SWA value".to_string()
                } else {
                    format!("has {} tokens, the SWA value {}", n.key.len(), value.len())
                }
            )));
        }
        let len = value.len() as u64;
        let locked = n.swa.lock_ref > 0;
        self.n_mut(s).swa.value = Some(value);
        self.lru_insert_after(NONE, s);
        if locked {
            self.swa_protected += len
        } else {
            self.swa_evictable += len
        }
        Ok(())
    }

    /// SGLang's `_walk_span`: `(node, position, matched tokens)` along `key` through `end`,
    /// stopping at a FULL-evicted node or a partial match (after reporting it).
    fn walk_span(&self, ns: u32, key: &[i64], end: usize) -> Vec<(u32, usize, usize)> {
        let page = self.page;
        let key = &key[..key.len() / page * page];
        let (mut node, mut pos) = (self.root, 0);
        let mut out = Vec::new();
        while pos < end && pos < key.len() {
            let Some(c) = self.child(node, ns, &key[pos..pos + page]) else { break };
            if self.n(c).full.value.is_none() {
                break;
            }
            let p = self.common(c, &key[pos..]);
            if p == 0 {
                break;
            }
            out.push((c, pos, p));
            if p < self.n(c).key.len() {
                break;
            }
            node = c;
            pos += p;
        }
        out
    }

    /// The least recent unlocked SWA value from `from` (inclusive) toward the MRU end.
    fn lru_unlocked_from(&self, mut u: u32) -> u32 {
        while u != NONE && self.n(u).swa.lock_ref > 0 {
            u = self.n(u).lru_prev;
        }
        u
    }
}

/// SGLang's tree core for `[FULL]` and `[FULL, SWA]` (see the module docs).
#[pyclass(frozen, module = "radixkv._radixkv")]
pub struct NativeTreeCore {
    tree: Mutex<Tree>,
    #[pyo3(get)]
    page_size: usize,
}

/// `parts`, concatenated, as native int64 bytes in a new `bytearray` (one copy; the GIL is
/// held throughout: the tree's mutex is never held without it).
fn bytes_of_parts<'py>(py: Python<'py>, parts: &[&[i64]]) -> PyResult<Bound<'py, PyByteArray>> {
    let n: usize = parts.iter().map(|p| p.len() * 8).sum();
    // SAFETY: a NULL source makes an uninitialized bytearray of `n` bytes (or fails with a
    // Python error, returned here); it is filled in full below before anyone reads it.
    let ba = unsafe {
        let p = pyo3::ffi::PyByteArray_FromStringAndSize(std::ptr::null(), n as isize);
        Bound::from_owned_ptr_or_err(py, p)?.cast_into_unchecked::<PyByteArray>()
    };
    if n == 0 {
        return Ok(ba);
    }
    // SAFETY: the new bytearray's buffer holds `n` bytes; nothing else refers to the object
    // until this function returns it, so nothing reads or resizes it meanwhile.
    let buf = unsafe {
        std::slice::from_raw_parts_mut(pyo3::ffi::PyByteArray_AsString(ba.as_ptr()).cast::<u8>(), n)
    };
    let mut at = 0;
    for p in parts {
        for (d, x) in buf[at..at + p.len() * 8].chunks_exact_mut(8).zip(p.iter()) {
            d.copy_from_slice(&x.to_ne_bytes());
        }
        at += p.len() * 8;
    }
    Ok(ba)
}

fn bytes_of<'py>(py: Python<'py>, v: &[i64]) -> PyResult<Bound<'py, PyByteArray>> {
    bytes_of_parts(py, &[v])
}

/// An argument's integers as `i64`s, the first `limit` (all when None): a buffer holding
/// aligned, contiguous 8-byte integers (a request's `array('q')`, an int64 tensor) is read in
/// place ([`to_input64_held`]): take every argument's `Input64` first, then read them with
/// this, making no Python object and calling no Python code until done with the slices.
fn ints_of<'a>(
    input: &'a Input64,
    what: &'static str,
    limit: Option<usize>,
    scratch: &'a mut Vec<u64>,
) -> PyResult<&'a [i64]> {
    let v = input.view().get(what, scratch).map_err(|e| {
        PyValueError::new_err(format!(
            "{}[{}] = {} is out of range for int64",
            e.what, e.index, e.value
        ))
    })?;
    // SAFETY: `u64` and `i64` have the same size and alignment and every bit pattern is
    // valid for both; the slice borrows `input` or `scratch`, as the returned one does.
    let v = unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<i64>(), v.len()) };
    Ok(&v[..limit.map_or(v.len(), |n| n.min(v.len()))])
}

impl Tree {
    fn need_swa(&self, what: &str) -> PyResult<()> {
        if self.window == 0 {
            return Err(PyValueError::new_err(format!(
                "{what}: this tree core has no SWA component (made with swa_window=0)"
            )));
        }
        Ok(())
    }
}

impl NativeTreeCore {
    fn t(&self) -> PyResult<std::sync::MutexGuard<'_, Tree>> {
        self.tree.lock().map_err(|_| PyRuntimeError::new_err("tree core poisoned by a panic"))
    }
}

#[pymethods]
impl NativeTreeCore {
    /// A tree core of `page_size`-token pages; node ids start at `first_id`; `swa_window`
    /// (SGLang's `swa_retain_window`, in tokens) adds the SWA component, 0 none.
    #[new]
    #[pyo3(signature = (page_size, first_id=1, swa_window=0))]
    fn new(page_size: usize, first_id: u64, swa_window: usize) -> PyResult<Self> {
        if page_size == 0 {
            return Err(PyValueError::new_err("page_size must be at least 1, got 0"));
        }
        Ok(NativeTreeCore {
            tree: Mutex::new(Tree::new(page_size, first_id, swa_window)),
            page_size,
        })
    }

    /// The SWA window in tokens (0: no SWA component).
    fn swa_window(&self) -> PyResult<usize> {
        Ok(self.t()?.window)
    }

    /// Takes the SWA window lock from `node` (SGLang's SWA `acquire_component_lock`);
    /// returns the segment boundary's stamp (0: the segment reached the root).
    fn swa_inc_lock(&self, node: u64) -> PyResult<u64> {
        let mut t = self.t()?;
        let s = t.slot(node)?;
        t.need_swa("swa_inc_lock")?;
        Ok(t.swa_lock(s))
    }

    /// Releases a window lock taken by `swa_inc_lock` with stamp `uuid`.
    fn swa_dec_lock(&self, node: u64, uuid: u64) -> PyResult<()> {
        let mut t = self.t()?;
        let s = t.slot(node)?;
        t.need_swa("swa_dec_lock")?;
        t.swa_unlock(s, uuid, false).map(|_| ())
    }

    /// SGLang's `dec_swa_lock_only` (`release_window_lock`): releases the window lock
    /// early; the FULL indices of the SWA values it evicted (int64 bytes; SWA frees by FULL
    /// index).
    fn dec_swa_lock_only<'py>(
        &self,
        py: Python<'py>,
        node: u64,
        uuid: u64,
    ) -> PyResult<Bound<'py, PyByteArray>> {
        let mut t = self.t()?;
        let s = t.slot(node)?;
        t.need_swa("dec_swa_lock_only")?;
        let frees = t.swa_unlock(s, uuid, true)?;
        drop(t);
        bytes_of(py, &frees)
    }

    /// Stores the node's SWA value (the cache's `SWARebuild`: SGLang's
    /// `set_component_device_value`), the most recent in the SWA LRU.
    fn swa_set_value(&self, node: u64, values: &Bound<'_, PyAny>) -> PyResult<()> {
        let input = to_input64_held(values, "values")?;
        let mut scratch = Vec::new();
        let v = ints_of(&input, "values", None, &mut scratch)?.to_vec();
        let mut t = self.t()?;
        let s = t.slot(node)?;
        t.need_swa("set_component_device_value")?;
        t.swa_set(s, v)
    }

    /// The node's SWA value (int64 bytes), or None (a tombstone, or no SWA component).
    fn swa_value<'py>(
        &self,
        py: Python<'py>,
        node: u64,
    ) -> PyResult<Option<Bound<'py, PyByteArray>>> {
        let t = self.t()?;
        let n = t.n(t.slot(node)?);
        n.swa.value.as_ref().map(|v| bytes_of(py, v)).transpose()
    }

    /// `(SWA value length or -1, SWA lock_ref, boundary stamp, in the SWA LRU)`.
    fn swa_info(&self, node: u64) -> PyResult<(i64, u32, u64, bool)> {
        let t = self.t()?;
        let n = t.n(t.slot(node)?);
        Ok((
            n.swa.value.as_ref().map_or(-1, |v| v.len() as i64),
            n.swa.lock_ref,
            n.swa_uuid,
            n.in_lru,
        ))
    }

    /// `(evictable, protected)` SWA tokens.
    fn swa_sizes(&self) -> PyResult<(u64, u64)> {
        let t = self.t()?;
        Ok((t.swa_evictable, t.swa_protected))
    }

    /// The SWA LRU, most recent first (node ids).
    fn swa_lru<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let t = self.t()?;
        let mut out = Vec::new();
        let mut u = t.lru_head;
        while u != NONE {
            out.push(t.n(u).id);
            u = t.n(u).lru_next;
        }
        PyList::new(py, out)
    }

    /// Refreshes the window back from `node` in the SWA LRU (SGLang's INSERT_END refresh).
    fn swa_refresh(&self, node: u64) -> PyResult<()> {
        let mut t = self.t()?;
        let s = t.slot(node)?;
        t.need_swa("swa_refresh")?;
        t.swa_refresh(s);
        Ok(())
    }

    /// Starts SGLang's SWA device-eviction walk for `request` SWA tokens: from the least
    /// recent unlocked SWA value.
    fn swa_evict_start(&self, request: u64) -> PyResult<()> {
        let mut t = self.t()?;
        t.need_swa("evict_device_start(SWA)")?;
        let c = t.lru_unlocked_from(t.lru_tail);
        let cur = (c != NONE).then(|| (c, t.n(c).id));
        t.walk.swa_cursor = cur;
        t.walk.swa_request = request;
        t.walk.swa_open = true;
        Ok(())
    }

    /// One step of the SWA walk, `evicted` SWA tokens so far: None (done), `(leaf, None)`
    /// (a device leaf for the controller to evict whole), or `(node, FULL indices)`: an
    /// internal node made a tombstone (its SWA slots to free, by FULL index).
    fn swa_evict_next<'py>(
        &self,
        py: Python<'py>,
        evicted: u64,
    ) -> PyResult<Option<(u64, Option<Bound<'py, PyByteArray>>)>> {
        let mut t = self.t()?;
        if !t.walk.swa_open {
            return Err(PyRuntimeError::new_err(
                "evict_device_next_node(SWA): no SWA walk started",
            ));
        }
        let listed = |t: &Tree, c: Option<(u32, u64)>| {
            c.is_some_and(|(s, id)| {
                t.nodes
                    .get(s as usize)
                    .and_then(|n| n.as_ref())
                    .is_some_and(|n| n.id == id && n.in_lru)
            })
        };
        if t.walk.swa_cursor.is_some() && !listed(&t, t.walk.swa_cursor) {
            let c = t.lru_unlocked_from(t.lru_tail);
            t.walk.swa_cursor = (c != NONE).then(|| (c, t.n(c).id));
        }
        if evicted >= t.walk.swa_request || !listed(&t, t.walk.swa_cursor) {
            return Ok(None);
        }
        let (x, id) = t.walk.swa_cursor.expect("listed");
        let p = t.n(x).lru_prev;
        let p = if p == NONE { NONE } else { t.lru_unlocked_from(p) };
        t.walk.swa_cursor = (p != NONE).then(|| (p, t.n(p).id));
        if t.leaves.contains(&x) {
            return Ok(Some((id, None)));
        }
        let full = t.n(x).full.value.clone().unwrap_or_default();
        t.swa_tombstone(x);
        drop(t);
        Ok(Some((id, Some(bytes_of(py, &full)?))))
    }

    /// SGLang's `swa_tombstone_ranges`: the maximal SWA-tombstoned ranges of `tokens`'
    /// path within `[start, end)`.
    fn swa_tombstone_ranges(
        &self,
        ns: u32,
        tokens: &Bound<'_, PyAny>,
        start: usize,
        end: usize,
    ) -> PyResult<Vec<(usize, usize)>> {
        let input = to_input64_held(tokens, "tokens")?;
        let mut scratch = Vec::new();
        let key = ints_of(&input, "tokens", None, &mut scratch)?;
        let t = self.t()?;
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
    /// `[window_start, window_end)` of `tokens`' path) on that span's tombstones, splitting
    /// the end nodes at the span's edges. Refused, with nothing changed, when the span is
    /// not all tombstones on the tree or the values do not fit it.
    fn attach_swa_window(
        &self,
        ns: u32,
        tokens: &Bound<'_, PyAny>,
        window_start: usize,
        window_end: usize,
        swa_values: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let key_in = to_input64_held(tokens, "tokens")?;
        let vals_in = to_input64_held(swa_values, "swa_values")?;
        let (mut s1, mut s2) = (Vec::new(), Vec::new());
        let key = ints_of(&key_in, "tokens", None, &mut s1)?;
        let vals = ints_of(&vals_in, "swa_values", None, &mut s2)?;
        let refuse = |why: String| {
            Err(PyValueError::new_err(format!(
                "attach_swa_window [{window_start}, {window_end}): {why}; nothing was changed"
            )))
        };
        if window_end < window_start || vals.len() != window_end - window_start {
            return refuse(format!("{} SWA values for the span", vals.len()));
        }
        let mut t = self.t()?;
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
            let v = vals[lo - window_start..hi - window_start].to_vec();
            t.swa_set(target, v)?;
        }
        Ok(())
    }

    /// Ends the SWA walk.
    fn swa_evict_end(&self) -> PyResult<()> {
        let mut t = self.t()?;
        t.walk.swa_cursor = None;
        t.walk.swa_open = false;
        Ok(())
    }

    /// Drops every node; the new root gets a fresh id.
    fn reset(&self) -> PyResult<()> {
        self.t()?.reset();
        Ok(())
    }

    /// The root's id.
    fn root_id(&self) -> PyResult<u64> {
        let t = self.t()?;
        Ok(t.n(t.root).id)
    }

    /// `(device_prefix_len, last_device_node, full_kv_hit_length, last_visited_node or -1)`
    /// for the first `limit` tokens (all when None: SGLang's `RadixKey.limit`).
    #[pyo3(signature = (ns, tokens, limit=None))]
    fn match_prefix(
        &self,
        ns: u32,
        tokens: &Bound<'_, PyAny>,
        limit: Option<usize>,
    ) -> PyResult<(usize, u64, usize, i64)> {
        let input = to_input64_held(tokens, "tokens")?;
        let mut scratch = Vec::new();
        let key = ints_of(&input, "tokens", limit, &mut scratch)?;
        let mut t = self.t()?;
        let (m, best, hit, last) = t.match_walk(ns, key);
        let last = if last == NONE { -1 } else { t.n(last).id as i64 };
        Ok((m, t.n(best).id, hit, last))
    }

    /// `(matched tokens, deepest node, FULL tokens pinned by it)`: read-only.
    #[pyo3(signature = (ns, tokens, limit=None))]
    fn match_full_device_prefix(
        &self,
        ns: u32,
        tokens: &Bound<'_, PyAny>,
        limit: Option<usize>,
    ) -> PyResult<(usize, u64, usize)> {
        let input = to_input64_held(tokens, "tokens")?;
        let mut scratch = Vec::new();
        let key = ints_of(&input, "tokens", limit, &mut scratch)?;
        let t = self.t()?;
        let (m, n, p) = t.match_read(ns, key);
        Ok((m, t.n(n).id, p))
    }

    /// Inserts the first `limit` of `tokens` (all when None) -> `values` (`values=None`: the
    /// tokens themselves, as SGLang does); returns `(prefix_len, last_device_node,
    /// duplicates)`: `duplicates` the int64 bytes of the request's indices past
    /// `prev_prefix_len` that the tree already held (to free), or None.
    #[pyo3(signature = (ns, tokens, values, prev_prefix_len=0, limit=None))]
    fn insert<'py>(
        &self,
        py: Python<'py>,
        ns: u32,
        tokens: &Bound<'py, PyAny>,
        values: &Bound<'py, PyAny>,
        prev_prefix_len: usize,
        limit: Option<usize>,
    ) -> PyResult<(usize, u64, Option<Bound<'py, PyByteArray>>)> {
        let key_in = to_input64_held(tokens, "tokens")?;
        let vals_in =
            if values.is_none() { None } else { Some(to_input64_held(values, "values")?) };
        let (mut s1, mut s2) = (Vec::new(), Vec::new());
        let key = ints_of(&key_in, "tokens", limit, &mut s1)?;
        let vals = match &vals_in {
            Some(v) => ints_of(v, "values", None, &mut s2)?,
            None => key,
        };
        let aligned = key.len() / self.page_size * self.page_size;
        if vals.len() < aligned {
            return Err(PyValueError::new_err(format!(
                "insert: values has {} indices for {} (page-aligned) tokens; nothing was inserted",
                vals.len(),
                aligned
            )));
        }
        let mut t = self.t()?;
        let (p, node, frees) = t.insert(ns, key, vals, prev_prefix_len);
        let id = t.n(node).id;
        drop(t);
        Ok((p, id, if frees.is_empty() { None } else { Some(bytes_of(py, &frees)?) }))
    }

    /// The insert with SWA's rules (an SWA tree core only): `(prefix_len, last_device_node,
    /// actions)`, actions `(kind, node id or -1, int64 bytes, int64 bytes or None)` in
    /// SGLang's order, kind 0 `FreeDeviceKV`, 1 `FreeDeviceKVFullOnly`, 2 `SWARebuild`, 3
    /// `RecoverSWAWithLockedFull`; `swa_start` the request's SWA-evicted prefix
    /// (page-aligned). The window refresh that ends SGLang's insert is `swa_refresh`'s
    /// (after the cache stored the rebuilt values), or done here when no action is a
    /// barrier (kinds 2, 3): the fifth field says which (True: done).
    #[pyo3(signature = (ns, tokens, values, prev_prefix_len=0, swa_start=0, limit=None))]
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn insert_swa<'py>(
        &self,
        py: Python<'py>,
        ns: u32,
        tokens: &Bound<'py, PyAny>,
        values: &Bound<'py, PyAny>,
        prev_prefix_len: usize,
        swa_start: usize,
        limit: Option<usize>,
    ) -> PyResult<(
        usize,
        u64,
        Vec<(u8, i64, Bound<'py, PyByteArray>, Option<Bound<'py, PyByteArray>>)>,
        bool,
    )> {
        let key_in = to_input64_held(tokens, "tokens")?;
        let vals_in =
            if values.is_none() { None } else { Some(to_input64_held(values, "values")?) };
        let (mut s1, mut s2) = (Vec::new(), Vec::new());
        let key = ints_of(&key_in, "tokens", limit, &mut s1)?;
        let vals = match &vals_in {
            Some(v) => ints_of(v, "values", None, &mut s2)?,
            None => key,
        };
        let aligned = key.len() / self.page_size * self.page_size;
        if vals.len() < aligned {
            return Err(PyValueError::new_err(format!(
                "insert: values has {} indices for {} (page-aligned) tokens; nothing was inserted",
                vals.len(),
                aligned
            )));
        }
        if !swa_start.is_multiple_of(self.page_size) {
            return Err(PyValueError::new_err(format!(
                "insert: the SWA-evicted prefix ({swa_start}) is not a multiple of the page size                  ({}); nothing was inserted",
                self.page_size
            )));
        }
        let mut t = self.t()?;
        t.need_swa("insert_swa")?;
        let mut acts = Vec::new();
        let (p, node, frees) = t.insert_with(ns, key, vals, prev_prefix_len, swa_start, &mut acts);
        debug_assert!(frees.is_empty());
        let barrier = acts.iter().any(|a| matches!(a, Act::Rebuild(..) | Act::RecoverLocked(..)));
        if !barrier && node != t.root {
            t.swa_refresh(node);
        }
        let id = t.n(node).id;
        drop(t);
        let mut out = Vec::with_capacity(acts.len());
        for a in acts {
            out.push(match a {
                Act::Free(v) => (0, -1, bytes_of(py, &v)?, None),
                Act::FreeFullOnly(v) => (1, -1, bytes_of(py, &v)?, None),
                Act::Rebuild(n, v) => (2, n as i64, bytes_of(py, &v)?, None),
                Act::RecoverLocked(n, a, b) => {
                    (3, n as i64, bytes_of(py, &a)?, Some(bytes_of(py, &b)?))
                }
            });
        }
        Ok((p, id, out, !barrier))
    }

    /// Locks the node's root path; returns the tokens that became protected.
    fn inc_lock_ref(&self, node: u64) -> PyResult<u64> {
        let mut t = self.t()?;
        let s = t.slot(node)?;
        Ok(t.lock(s))
    }

    /// Releases a lock taken by `inc_lock_ref`; returns the tokens that became evictable.
    fn dec_lock_ref(&self, node: u64) -> PyResult<u64> {
        let mut t = self.t()?;
        let s = t.slot(node)?;
        t.unlock(s)
    }

    /// `(evictable, protected)` FULL tokens.
    fn sizes(&self) -> PyResult<(u64, u64)> {
        let t = self.t()?;
        Ok((t.evictable, t.protected))
    }

    /// Starts an eviction walk for `request` tokens: the evictable leaves, oldest first.
    fn evict_start(&self, request: u64) -> PyResult<()> {
        let mut t = self.t()?;
        let heap: BinaryHeap<Entry> =
            t.leaves.iter().map(|&s| Entry(t.n(s).last_access, s, t.n(s).id)).collect();
        t.walk.request = request;
        t.walk.heap = heap;
        t.walk.last = None;
        t.walk.open = true;
        Ok(())
    }

    /// The walk's next victim (`None` when done: `evicted` reached the request, or no leaf).
    fn evict_next(&self, evicted: u64) -> PyResult<Option<u64>> {
        let mut t = self.t()?;
        if !t.walk.open {
            return Err(PyRuntimeError::new_err(
                "evict_device_next_node: no eviction walk started",
            ));
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

    /// Evicts a leaf (deletes it: this core keeps no host copy); returns its device indices
    /// (int64 bytes) for the allocator.
    fn evict_leaf<'py>(&self, py: Python<'py>, node: u64) -> PyResult<Bound<'py, PyByteArray>> {
        let mut t = self.t()?;
        let s = t.slot(node)?;
        if !t.is_leaf(s) {
            return Err(PyValueError::new_err(format!(
                "evict_device_leaf: node {node} is not an evictable device leaf (locked, the \
                 root, or has children on the device); nothing was changed"
            )));
        }
        let parent = t.n(s).parent;
        let v = t.remove_leaf(s);
        if t.walk.open {
            t.walk.last = Some((parent, 0));
        }
        let out = bytes_of(py, &v);
        t.give_back(v);
        out
    }

    /// Ends the eviction walk.
    fn evict_end(&self) -> PyResult<()> {
        let mut t = self.t()?;
        t.walk.heap = BinaryHeap::new();
        t.walk.last = None;
        t.walk.open = false;
        Ok(())
    }

    /// The FULL device indices from `from_node` up to, not including, `until_node`, in root
    /// order (int64 bytes).
    fn collect_indices<'py>(
        &self,
        py: Python<'py>,
        from_node: u64,
        until_node: u64,
    ) -> PyResult<Bound<'py, PyByteArray>> {
        let t = self.t()?;
        let mut s = t.slot(from_node)?;
        let until = t.slot(until_node)?;
        let mut chunks = Vec::new();
        while s != until {
            if s == NONE || s == t.root {
                return Err(PyValueError::new_err(format!(
                    "collect_full_device_indices: node {until_node} is not an ancestor of node {from_node}"
                )));
            }
            let Some(v) = t.n(s).full.value.as_ref() else {
                return Err(PyValueError::new_err(format!(
                    "collect_full_device_indices: node {} on the path has no device value",
                    t.n(s).id
                )));
            };
            chunks.push(v.as_slice());
            s = t.n(s).parent;
        }
        chunks.reverse();
        bytes_of_parts(py, &chunks)
    }

    /// Whether the node has no FULL device value (the root never).
    fn is_evicted(&self, node: u64) -> PyResult<bool> {
        let t = self.t()?;
        let s = t.slot(node)?;
        Ok(s != t.root && t.n(s).full.value.is_none())
    }

    /// Whether `node` is the root.
    fn is_root(&self, node: u64) -> PyResult<bool> {
        let t = self.t()?;
        Ok(t.slot(node)? == t.root)
    }

    /// `(parent id or -1, key length, value length or -1, lock_ref, child count, last access,
    /// namespace)`.
    fn node_info(&self, node: u64) -> PyResult<(i64, usize, i64, u32, usize, f64, u32)> {
        let t = self.t()?;
        let n = t.n(t.slot(node)?);
        let parent = if n.parent == NONE { -1 } else { t.n(n.parent).id as i64 };
        let vlen = n.full.value.as_ref().map_or(-1, |v| v.len() as i64);
        Ok((
            parent,
            n.key.len(),
            vlen,
            n.full.lock_ref,
            t.kid_count(t.slot(node)?),
            n.last_access,
            n.ns,
        ))
    }

    /// The node's children ids, in insertion order.
    fn children<'py>(&self, py: Python<'py>, node: u64) -> PyResult<Bound<'py, PyList>> {
        let t = self.t()?;
        let n = t.n(t.slot(node)?);
        let _ = n;
        let ids: Vec<u64> = t.kids(t.slot(node)?).map(|c| t.n(c).id).collect();
        PyList::new(py, ids)
    }

    /// The node's key tokens (int64 bytes).
    fn key<'py>(&self, py: Python<'py>, node: u64) -> PyResult<Bound<'py, PyByteArray>> {
        let t = self.t()?;
        let n = t.n(t.slot(node)?);
        bytes_of(py, &n.key)
    }

    /// The node's FULL device value (int64 bytes), or None when evicted.
    fn value<'py>(&self, py: Python<'py>, node: u64) -> PyResult<Option<Bound<'py, PyByteArray>>> {
        let t = self.t()?;
        let n = t.n(t.slot(node)?);
        n.full.value.as_ref().map(|v| bytes_of(py, v)).transpose()
    }

    /// Every node id, depth first from the root in child order (the root first).
    fn dfs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let t = self.t()?;
        let mut out = Vec::new();
        let mut stack = vec![t.root];
        while let Some(s) = stack.pop() {
            out.push(t.n(s).id);
            for c in t.kids(s).rev() {
                stack.push(c);
            }
        }
        PyList::new(py, out)
    }

    /// Why the tree is inconsistent (sizes against a recount, leaf set, lock refs, parent
    /// links), or None.
    fn check(&self) -> PyResult<Option<String>> {
        let t = self.t()?;
        let (mut ev, mut pr) = (0u64, 0u64);
        let (mut sev, mut spr, mut listed) = (0u64, 0u64, 0usize);
        let mut stack = vec![t.root];
        let mut seen = 0usize;
        while let Some(s) = stack.pop() {
            seen += 1;
            let n = t.n(s);
            if n.swa.value.is_some() != n.in_lru {
                return Ok(Some(format!("node {}: SWA value and SWA LRU membership differ", n.id)));
            }
            if let Some(v) = n.swa.value.as_ref() {
                if v.len() != n.key.len() {
                    return Ok(Some(format!(
                        "node {}: SWA value length differs from key length",
                        n.id
                    )));
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
                    return Ok(Some(format!(
                        "node {}: value length differs from key length",
                        n.id
                    )));
                }
                if n.key.is_empty() || n.key.len() % t.page != 0 {
                    return Ok(Some(format!(
                        "node {}: key length {} not a page multiple",
                        n.id,
                        n.key.len()
                    )));
                }
            }
            if t.is_leaf(s) != t.leaves.contains(&s) {
                return Ok(Some(format!("node {}: leaf set out of date", n.id)));
            }
            for c in t.kids(s) {
                if t.n(c).parent != s {
                    return Ok(Some(format!("node {}: parent link broken", t.n(c).id)));
                }
                if n.full.lock_ref < t.n(c).full.lock_ref && s != t.root {
                    return Ok(Some(format!("node {}: locked less than its child", n.id)));
                }
                stack.push(c);
            }
        }
        if seen != t.ids.len() {
            return Ok(Some(format!("{} nodes reachable, {} registered", seen, t.ids.len())));
        }
        let mut walked = 0usize;
        let (mut u, mut prev) = (t.lru_head, NONE);
        while u != NONE {
            if t.n(u).lru_prev != prev || walked > listed {
                return Ok(Some("SWA LRU links broken".to_string()));
            }
            walked += 1;
            prev = u;
            u = t.n(u).lru_next;
        }
        if walked != listed || t.lru_tail != prev {
            return Ok(Some(format!("SWA LRU holds {walked} nodes, {listed} have SWA values")));
        }
        if (sev, spr) != (t.swa_evictable, t.swa_protected) {
            return Ok(Some(format!(
                "SWA sizes: counted evictable {sev} protected {spr}, kept {} {}",
                t.swa_evictable, t.swa_protected
            )));
        }
        if (ev, pr) != (t.evictable, t.protected) {
            return Ok(Some(format!(
                "sizes: counted evictable {ev} protected {pr}, kept {} {}",
                t.evictable, t.protected
            )));
        }
        Ok(None)
    }
}
