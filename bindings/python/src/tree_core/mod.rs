//! `radixkv._radixkv.NativeTreeCore`: the tree of SGLang's `UnifiedRadixCache` for the
//! component sets `[FULL]`, `[FULL, SWA]` (`swa_window > 0`), `[FULL, MAMBA]` and
//! `[FULL, SWA, MAMBA]` (`mamba=True`), one native call per
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
//! LRU end), and Mamba's when the tree has one (SGLang's `components/mamba.py`: one state
//! per node where a sequence ended, a lock on the node alone, Mamba tombstones, an LRU and
//! eviction walk of its own, the per-path state cap; `tree_core/mamba.rs`).
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
use crate::slots::bytearray_held;

mod mamba;
mod tree;

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

fn missing(id: u64) -> PyErr {
    PyKeyError::new_err(format!("node id {id} is not in this tree core (evicted, or never made)"))
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
    bytearray_held(py, n, |buf| {
        let mut at = 0;
        for p in parts {
            for (d, x) in buf[at..at + p.len() * 8].chunks_exact_mut(8).zip(p.iter()) {
                d.copy_from_slice(&x.to_ne_bytes());
            }
            at += p.len() * 8;
        }
    })
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

/// An argument's integers as an owned `Vec<i64>` (a value the tree keeps): [`ints_of`]
/// over the whole argument, copied once.
fn owned_ints(values: &Bound<'_, PyAny>, what: &'static str) -> PyResult<Vec<i64>> {
    let input = to_input64_held(values, what)?;
    let mut scratch = Vec::new();
    Ok(ints_of(&input, what, None, &mut scratch)?.to_vec())
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
    ) -> Result<Option<usize>, ()> {
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
    fn list_ids(&self, head: u32, next: impl Fn(&Node) -> u32) -> Vec<u64> {
        let mut out = Vec::new();
        let mut u = head;
        while u != NONE {
            out.push(self.n(u).id);
            u = next(self.n(u));
        }
        out
    }

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
    /// Refuses an insert whose values do not cover its page-aligned tokens.
    fn check_values(&self, key_len: usize, vals_len: usize) -> PyResult<()> {
        let aligned = key_len / self.page_size * self.page_size;
        if vals_len < aligned {
            return Err(PyValueError::new_err(format!(
                "insert: values has {vals_len} indices for {aligned} (page-aligned) tokens; nothing was inserted"
            )));
        }
        Ok(())
    }

    fn t(&self) -> PyResult<std::sync::MutexGuard<'_, Tree>> {
        self.tree.lock().map_err(|_| PyRuntimeError::new_err("tree core poisoned by a panic"))
    }
}

#[pymethods]
impl NativeTreeCore {
    /// A tree core of `page_size`-token pages; node ids start at `first_id`; `swa_window`
    /// (SGLang's `swa_retain_window`, in tokens) adds the SWA component, 0 none.
    /// `mamba` adds the Mamba component (one recurrent state per node).
    #[new]
    #[pyo3(signature = (page_size, first_id=1, swa_window=0, mamba=false))]
    fn new(page_size: usize, first_id: u64, swa_window: usize, mamba: bool) -> PyResult<Self> {
        if page_size == 0 {
            return Err(PyValueError::new_err("page_size must be at least 1, got 0"));
        }
        Ok(NativeTreeCore {
            tree: Mutex::new(Tree::new(page_size, first_id, swa_window, mamba)),
            page_size,
        })
    }

    /// Whether the tree has a Mamba component.
    fn has_mamba(&self) -> PyResult<bool> {
        Ok(self.t()?.mamba)
    }

    /// SGLang's Mamba commit on an insert's target `node` (`new_leaf`: the insert made it),
    /// `values` the request's state: returns SGLang's `mamba_exist` (True: the node kept the
    /// state it had; the request keeps its own).
    fn mamba_commit(&self, node: u64, new_leaf: bool, values: &Bound<'_, PyAny>) -> PyResult<bool> {
        let input = to_input64_held(values, "mamba_value")?;
        let mut scratch = Vec::new();
        let v = ints_of(&input, "mamba_value", None, &mut scratch)?;
        let mut t = self.t()?;
        let s = t.slot(node)?;
        t.need_mamba("insert(mamba_value)")?;
        let why = if s == t.root {
            Some(format!("node {node} is the root"))
        } else if v.is_empty() {
            Some("the Mamba state is empty".to_string())
        } else if new_leaf && t.n(s).mamba.value.is_some() {
            Some(format!("node {node} is not a new leaf: it has a Mamba state"))
        } else {
            None
        };
        if let Some(why) = why {
            return Err(PyValueError::new_err(format!(
                "insert: {why}; the Mamba state was not stored"
            )));
        }
        Ok(t.mamba_commit(s, new_leaf, v))
    }

    /// Stores the node's Mamba state (SGLang's `set_component_device_value` for Mamba).
    fn mamba_set_value(&self, node: u64, values: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = owned_ints(values, "values")?;
        let mut t = self.t()?;
        let s = t.slot(node)?;
        t.need_mamba("set_component_device_value")?;
        if let Some(why) = t.mamba_refusal(s, &v) {
            return Err(PyValueError::new_err(format!(
                "set_component_device_value: {why}; nothing was changed"
            )));
        }
        t.mamba_put(s, v);
        Ok(())
    }

    /// The node's Mamba state (int64 bytes), or None.
    fn mamba_value<'py>(
        &self,
        py: Python<'py>,
        node: u64,
    ) -> PyResult<Option<Bound<'py, PyByteArray>>> {
        let t = self.t()?;
        let n = t.n(t.slot(node)?);
        n.mamba.value.as_ref().map(|v| bytes_of(py, v)).transpose()
    }

    /// `(Mamba state length or -1, Mamba lock_ref, in the Mamba LRU)`.
    fn mamba_info(&self, node: u64) -> PyResult<(i64, u32, bool)> {
        let t = self.t()?;
        let n = t.n(t.slot(node)?);
        Ok((n.mamba.value.as_ref().map_or(-1, |v| v.len() as i64), n.mamba.lock_ref, n.in_mlru))
    }

    /// `(evictable, protected)` Mamba state slots.
    fn mamba_sizes(&self) -> PyResult<(u64, u64)> {
        let t = self.t()?;
        Ok((t.mamba_evictable, t.mamba_protected))
    }

    /// The Mamba LRU, most recent first (node ids).
    fn mamba_lru<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let t = self.t()?;
        PyList::new(py, t.list_ids(t.mlru_head, |n| n.mlru_next))
    }

    /// Takes the Mamba lock on `node` alone (SGLang's Mamba `acquire_component_lock`).
    fn mamba_inc_lock(&self, node: u64) -> PyResult<()> {
        let mut t = self.t()?;
        let s = t.slot(node)?;
        t.need_mamba("mamba_inc_lock")?;
        t.mamba_lock(s);
        Ok(())
    }

    /// Releases a lock taken by `mamba_inc_lock`.
    fn mamba_dec_lock(&self, node: u64) -> PyResult<()> {
        let mut t = self.t()?;
        let s = t.slot(node)?;
        t.need_mamba("mamba_dec_lock")?;
        t.mamba_unlock(s)
    }

    /// Starts SGLang's Mamba device-eviction walk for `request` states: from the least
    /// recent unlocked state.
    fn mamba_evict_start(&self, request: u64) -> PyResult<()> {
        let mut t = self.t()?;
        t.need_mamba("evict_device_start(MAMBA)")?;
        let c = t.mlru_unlocked_from(t.mlru_tail);
        let cur = (c != NONE).then(|| (c, t.n(c).id));
        t.walk.mamba_cursor = cur;
        t.walk.mamba_request = request;
        t.walk.mamba_open = true;
        Ok(())
    }

    /// One step of the Mamba walk, `evicted` states so far: None (done), `(leaf, None)` (a
    /// device leaf for the controller to evict whole), or `(node, state)`: a node made a
    /// Mamba tombstone (its state, int64 bytes, to free).
    fn mamba_evict_next<'py>(
        &self,
        py: Python<'py>,
        evicted: u64,
    ) -> PyResult<Option<(u64, Option<Bound<'py, PyByteArray>>)>> {
        let mut t = self.t()?;
        if !t.walk.mamba_open {
            return Err(PyRuntimeError::new_err(
                "evict_device_next_node(MAMBA): no Mamba walk started",
            ));
        }
        let step = t.mamba_walk_next(evicted);
        drop(t);
        match step {
            None => Ok(None),
            Some((id, None)) => Ok(Some((id, None))),
            Some((id, Some(v))) => Ok(Some((id, Some(bytes_of(py, &v)?)))),
        }
    }

    /// Ends the Mamba walk.
    fn mamba_evict_end(&self) -> PyResult<()> {
        let mut t = self.t()?;
        t.walk.mamba_cursor = None;
        t.walk.mamba_open = false;
        Ok(())
    }

    /// SGLang's `evict_excess_path_states` with the path cap `cap` (at least 1): the states
    /// made tombstones on `node`'s root path (int64 bytes each), shallowest first.
    fn mamba_evict_excess<'py>(
        &self,
        py: Python<'py>,
        node: u64,
        cap: usize,
    ) -> PyResult<Vec<Bound<'py, PyByteArray>>> {
        let mut t = self.t()?;
        let s = t.slot(node)?;
        t.need_mamba("evict_excess_path_states")?;
        if cap == 0 {
            return Err(PyValueError::new_err(
                "evict_excess_path_states: the path cap must be at least 1 (SGLang's \
                 mamba_max_states_per_path: -1 or a positive integer); nothing was changed",
            ));
        }
        let out = t.mamba_evict_excess(s, cap);
        drop(t);
        out.iter().map(|v| bytes_of(py, v)).collect()
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
        let v = owned_ints(values, "values")?;
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
        PyList::new(py, t.list_ids(t.lru_head, |n| n.lru_next))
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

    /// One step of the SWA walk, `evicted` SWA tokens so far: None (done), `(leaf, None,
    /// None)` (a device leaf for the controller to evict whole), or `(node, FULL indices,
    /// Mamba state or None)`: an internal node made a tombstone (its SWA slots to free, by
    /// FULL index, and the Mamba state that went with them).
    #[allow(clippy::type_complexity)]
    fn swa_evict_next<'py>(
        &self,
        py: Python<'py>,
        evicted: u64,
    ) -> PyResult<Option<(u64, Option<Bound<'py, PyByteArray>>, Option<Bound<'py, PyByteArray>>)>>
    {
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
            return Ok(Some((id, None, None)));
        }
        let full = t.n(x).full.value.clone().unwrap_or_default();
        t.swa_tombstone(x);
        // SGLang's cascade: Mamba (internal priority 0) goes with SWA (1) on the node. A
        // Mamba-locked state stays (SGLang asserts there is none: an SWA walk meets only
        // nodes without a window lock, and a request's lock takes both or releases both).
        let m = t.n(x).mamba.value.is_some() && t.n(x).mamba.lock_ref == 0;
        let mamba = if m { Some(t.mamba_take(x)) } else { None };
        drop(t);
        let mamba = mamba.map(|v| bytes_of(py, &v)).transpose()?;
        Ok(Some((id, Some(bytes_of(py, &full)?), mamba)))
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
        self.check_values(key.len(), vals.len())?;
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
        self.check_values(key.len(), vals.len())?;
        if !swa_start.is_multiple_of(self.page_size) {
            return Err(PyValueError::new_err(format!(
                "insert: the SWA-evicted prefix ({swa_start}) is not a multiple of the page size ({}); nothing was inserted",
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
        let (mut mev, mut mpr, mut mlisted) = (0u64, 0u64, 0usize);
        let mut stack = vec![t.root];
        let mut seen = 0usize;
        while let Some(s) = stack.pop() {
            seen += 1;
            let n = t.n(s);
            if n.mamba.value.is_some() != n.in_mlru {
                return Ok(Some(format!(
                    "node {}: Mamba state and Mamba LRU membership differ",
                    n.id
                )));
            }
            if let Some(v) = n.mamba.value.as_ref() {
                mlisted += 1;
                if n.mamba.lock_ref > 0 { mpr += v.len() as u64 } else { mev += v.len() as u64 }
            }
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
        let swa = t.list_walk(t.lru_head, t.lru_tail, listed, |n| (n.lru_prev, n.lru_next));
        let mamba = t.list_walk(t.mlru_head, t.mlru_tail, mlisted, |n| (n.mlru_prev, n.mlru_next));
        for (name, n, what, walk) in
            [("SWA", listed, "have SWA values", swa), ("Mamba", mlisted, "have states", mamba)]
        {
            match walk {
                Err(()) => return Ok(Some(format!("{name} LRU links broken"))),
                Ok(Some(walked)) => {
                    return Ok(Some(format!("{name} LRU holds {walked} nodes, {n} {what}")));
                }
                Ok(None) => {}
            }
        }
        if (mev, mpr) != (t.mamba_evictable, t.mamba_protected) {
            return Ok(Some(format!(
                "Mamba sizes: counted evictable {mev} protected {mpr}, kept {} {}",
                t.mamba_evictable, t.mamba_protected
            )));
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
