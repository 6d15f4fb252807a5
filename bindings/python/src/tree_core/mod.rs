//! `radixkv._radixkv.NativeTreeCore`: the tree of SGLang's `UnifiedRadixCache` for the
//! component sets `[FULL]`, `[FULL, SWA]` (`swa_window > 0`), `[FULL, MAMBA]` and
//! `[FULL, SWA, MAMBA]` (`mamba=True`), one native call per interface call (the Python
//! adapter is `radixkv/_sglang_tree_core.py`).
//!
//! The tree is the core's [`radixkv::hybrid::HybridTree`] (its docs state the contract:
//! node ids, splits, SGLang's components, order and refusals); this is its Python face. It
//! reads the request's keys and values in place (`to_input64_held`), hands int64 results
//! back as `bytearray`s, and maps the core's refusals to the exceptions SGLang's own cores
//! raise: a missing node to `KeyError`, a walk step with no walk to `RuntimeError`, any other
//! refusal to `ValueError` with the refusal's message.
//!
//! The GIL is held throughout every call (no `Python::detach`): the mutex is only ever taken
//! with the GIL held, so two threads cannot each hold one and wait for the other, and the
//! request's key and values are read in place while no Python code runs.

use std::sync::Mutex;

use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyList};
use radixkv::Error;
use radixkv::hybrid::{CacheAction, Component, HybridOptions, HybridTree, MambaStep, SwaStep};

use crate::input::{Input64, to_input64_held};
use crate::slots::bytearray_held;

/// SGLang's tree core for `[FULL]`, `[FULL, SWA]`, `[FULL, MAMBA]` and `[FULL, SWA, MAMBA]`
/// (see the module docs).
#[pyclass(frozen, module = "radixkv._radixkv")]
pub struct NativeTreeCore {
    tree: Mutex<HybridTree>,
    #[pyo3(get)]
    page_size: usize,
}

/// The exception SGLang's cores raise for the core's refusal `e` (module docs).
fn py_err(e: Error) -> PyErr {
    match e {
        Error::NoNode { .. } => PyKeyError::new_err(e.to_string()),
        Error::NoWalk { .. } => PyRuntimeError::new_err(e.to_string()),
        Error::InvalidArgument(m) => PyValueError::new_err(m),
        e => PyValueError::new_err(e.to_string()),
    }
}

trait OrPy<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> OrPy<T> for radixkv::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(py_err)
    }
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

impl NativeTreeCore {
    fn t(&self) -> PyResult<std::sync::MutexGuard<'_, HybridTree>> {
        self.tree.lock().map_err(|_| PyRuntimeError::new_err("tree core poisoned by a panic"))
    }
}

type SwaStepOut<'py> = (u64, Option<Bound<'py, PyByteArray>>, Option<Bound<'py, PyByteArray>>);
type Action<'py> = (u8, i64, Bound<'py, PyByteArray>, Option<Bound<'py, PyByteArray>>);
type FreedOut<'py> = (u64, Vec<(&'static str, Bound<'py, PyByteArray>)>);

#[pymethods]
impl NativeTreeCore {
    /// A tree core of `page_size`-token pages; node ids start at `first_id`; `swa_window`
    /// (SGLang's `swa_retain_window`, in tokens) adds the SWA component, 0 none.
    /// `mamba` adds the Mamba component (one recurrent state per node).
    #[new]
    #[pyo3(signature = (page_size, first_id=1, swa_window=0, mamba=false))]
    fn new(page_size: usize, first_id: u64, swa_window: usize, mamba: bool) -> PyResult<Self> {
        let tree =
            HybridTree::new(HybridOptions { page_size, first_id, swa_window, mamba }).py()?;
        Ok(NativeTreeCore { tree: Mutex::new(tree), page_size })
    }

    /// Whether the tree has a Mamba component.
    fn has_mamba(&self) -> PyResult<bool> {
        Ok(self.t()?.has_mamba())
    }

    /// SGLang's Mamba commit on an insert's target `node` (`new_leaf`: the insert made it),
    /// `values` the request's state: returns SGLang's `mamba_exist` (True: the node kept the
    /// state it had; the request keeps its own).
    fn mamba_commit(&self, node: u64, new_leaf: bool, values: &Bound<'_, PyAny>) -> PyResult<bool> {
        let input = to_input64_held(values, "mamba_value")?;
        let mut scratch = Vec::new();
        let v = ints_of(&input, "mamba_value", None, &mut scratch)?;
        self.t()?.mamba_commit(node, new_leaf, v).py()
    }

    /// Stores the node's Mamba state (SGLang's `set_component_device_value` for Mamba).
    fn mamba_set_value(&self, node: u64, values: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = owned_ints(values, "values")?;
        self.t()?.mamba_set_value(node, v).py()
    }

    /// The node's Mamba state (int64 bytes), or None.
    fn mamba_value<'py>(
        &self,
        py: Python<'py>,
        node: u64,
    ) -> PyResult<Option<Bound<'py, PyByteArray>>> {
        let t = self.t()?;
        t.mamba_value(node).py()?.map(|v| bytes_of(py, v)).transpose()
    }

    /// `(Mamba state length or -1, Mamba lock_ref, in the Mamba LRU)`.
    fn mamba_info(&self, node: u64) -> PyResult<(i64, u32, bool)> {
        let i = self.t()?.mamba_info(node).py()?;
        Ok((i.value_len.map_or(-1, |n| n as i64), i.lock_ref, i.in_lru))
    }

    /// `(evictable, protected)` Mamba state slots.
    fn mamba_sizes(&self) -> PyResult<(u64, u64)> {
        let s = self.t()?.mamba_sizes();
        Ok((s.evictable, s.protected))
    }

    /// The Mamba LRU, most recent first (node ids).
    fn mamba_lru<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.t()?.mamba_lru())
    }

    /// Takes the Mamba lock on `node` alone (SGLang's Mamba `acquire_component_lock`).
    fn mamba_inc_lock(&self, node: u64) -> PyResult<()> {
        self.t()?.mamba_inc_lock(node).py()
    }

    /// Releases a lock taken by `mamba_inc_lock`.
    fn mamba_dec_lock(&self, node: u64) -> PyResult<()> {
        self.t()?.mamba_dec_lock(node).py()
    }

    /// Starts SGLang's Mamba device-eviction walk for `request` states: from the least
    /// recent unlocked state.
    fn mamba_evict_start(&self, request: u64) -> PyResult<()> {
        self.t()?.mamba_evict_start(request).py()
    }

    /// One step of the Mamba walk, `evicted` states so far: None (done), `(leaf, None)` (a
    /// device leaf for the controller to evict whole), or `(node, state)`: a node made a
    /// Mamba tombstone (its state, int64 bytes, to free).
    fn mamba_evict_next<'py>(
        &self,
        py: Python<'py>,
        evicted: u64,
    ) -> PyResult<Option<(u64, Option<Bound<'py, PyByteArray>>)>> {
        let step = self.t()?.mamba_evict_next(evicted).py()?;
        Ok(match step {
            None => None,
            Some(MambaStep::Leaf(id)) => Some((id, None)),
            Some(MambaStep::Tombstoned { node, state }) => {
                Some((node, Some(bytes_of(py, &state)?)))
            }
        })
    }

    /// Ends the Mamba walk.
    fn mamba_evict_end(&self) -> PyResult<()> {
        self.t()?.mamba_evict_end();
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
        let out = self.t()?.mamba_evict_excess(node, cap).py()?;
        out.iter().map(|v| bytes_of(py, v)).collect()
    }

    /// The SWA window in tokens (0: no SWA component).
    fn swa_window(&self) -> PyResult<usize> {
        Ok(self.t()?.swa_window())
    }

    /// Takes the SWA window lock from `node` (SGLang's SWA `acquire_component_lock`);
    /// returns the segment boundary's stamp (0: the segment reached the root).
    fn swa_inc_lock(&self, node: u64) -> PyResult<u64> {
        self.t()?.swa_inc_lock(node).py()
    }

    /// Releases a window lock taken by `swa_inc_lock` with stamp `uuid`.
    fn swa_dec_lock(&self, node: u64, uuid: u64) -> PyResult<()> {
        self.t()?.swa_dec_lock(node, uuid).py()
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
        let frees = self.t()?.swa_release_window(node, uuid).py()?;
        bytes_of(py, &frees)
    }

    /// Stores the node's SWA value (the cache's `SWARebuild`: SGLang's
    /// `set_component_device_value`), the most recent in the SWA LRU.
    fn swa_set_value(&self, node: u64, values: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = owned_ints(values, "values")?;
        self.t()?.swa_set_value(node, v).py()
    }

    /// The node's SWA value (int64 bytes), or None (a tombstone, or no SWA component).
    fn swa_value<'py>(
        &self,
        py: Python<'py>,
        node: u64,
    ) -> PyResult<Option<Bound<'py, PyByteArray>>> {
        let t = self.t()?;
        t.swa_value(node).py()?.map(|v| bytes_of(py, v)).transpose()
    }

    /// `(SWA value length or -1, SWA lock_ref, boundary stamp, in the SWA LRU)`.
    fn swa_info(&self, node: u64) -> PyResult<(i64, u32, u64, bool)> {
        let i = self.t()?.swa_info(node).py()?;
        Ok((i.value_len.map_or(-1, |n| n as i64), i.lock_ref, i.uuid, i.in_lru))
    }

    /// `(evictable, protected)` SWA tokens.
    fn swa_sizes(&self) -> PyResult<(u64, u64)> {
        let s = self.t()?.swa_sizes();
        Ok((s.evictable, s.protected))
    }

    /// The SWA LRU, most recent first (node ids).
    fn swa_lru<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.t()?.swa_lru())
    }

    /// Refreshes the window back from `node` in the SWA LRU (SGLang's INSERT_END refresh).
    fn swa_refresh(&self, node: u64) -> PyResult<()> {
        self.t()?.swa_refresh(node).py()
    }

    /// Starts SGLang's SWA device-eviction walk for `request` SWA tokens: from the least
    /// recent unlocked SWA value.
    fn swa_evict_start(&self, request: u64) -> PyResult<()> {
        self.t()?.swa_evict_start(request).py()
    }

    /// One step of the SWA walk, `evicted` SWA tokens so far: None (done), `(leaf, None,
    /// None)` (a device leaf for the controller to evict whole), or `(node, FULL indices,
    /// Mamba state or None)`: an internal node made a tombstone (its SWA slots to free, by
    /// FULL index, and the Mamba state that went with them).
    fn swa_evict_next<'py>(
        &self,
        py: Python<'py>,
        evicted: u64,
    ) -> PyResult<Option<SwaStepOut<'py>>> {
        let step = self.t()?.swa_evict_next(evicted).py()?;
        Ok(match step {
            None => None,
            Some(SwaStep::Leaf(id)) => Some((id, None, None)),
            Some(SwaStep::Tombstoned { node, full, mamba }) => {
                let mamba = mamba.map(|v| bytes_of(py, &v)).transpose()?;
                Some((node, Some(bytes_of(py, &full)?), mamba))
            }
        })
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
        self.t()?.swa_tombstone_ranges(ns, key, start, end).py()
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
        self.t()?.attach_swa_window(ns, key, window_start, window_end, vals).py()
    }

    /// Ends the SWA walk.
    fn swa_evict_end(&self) -> PyResult<()> {
        self.t()?.swa_evict_end();
        Ok(())
    }

    /// Drops every node; the new root gets a fresh id.
    fn reset(&self) -> PyResult<()> {
        self.t()?.reset();
        Ok(())
    }

    /// The root's id.
    fn root_id(&self) -> PyResult<u64> {
        Ok(self.t()?.root())
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
        let m = self.t()?.match_prefix(ns, key);
        let last = m.last_visited.map_or(-1, |n| n as i64);
        Ok((m.device_prefix_len, m.last_device_node, m.full_hit_len, last))
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
        let m = self.t()?.match_full_device_prefix(ns, key);
        Ok((m.len, m.node, m.pinned))
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
            Some(v) => Some(ints_of(v, "values", None, &mut s2)?),
            None => None,
        };
        let r = self.t()?.insert(ns, key, vals, prev_prefix_len).py()?;
        let dups = if r.duplicates.is_empty() { None } else { Some(bytes_of(py, &r.duplicates)?) };
        Ok((r.prefix_len, r.node, dups))
    }

    /// The insert with SWA's rules (an SWA tree core only): `(prefix_len, last_device_node,
    /// actions)`, actions `(kind, node id or -1, int64 bytes, int64 bytes or None)` in
    /// SGLang's order, kind 0 `FreeDeviceKV`, 1 `FreeDeviceKVFullOnly`, 2 `SWARebuild`, 3
    /// `RecoverSWAWithLockedFull`; `swa_start` the request's SWA-evicted prefix
    /// (page-aligned). The window refresh that ends SGLang's insert is `swa_refresh`'s
    /// (after the cache stored the rebuilt values), or done here when no action is a
    /// barrier (kinds 2, 3): the fourth field says which (True: done).
    #[pyo3(signature = (ns, tokens, values, prev_prefix_len=0, swa_start=0, limit=None))]
    #[allow(clippy::too_many_arguments)]
    fn insert_swa<'py>(
        &self,
        py: Python<'py>,
        ns: u32,
        tokens: &Bound<'py, PyAny>,
        values: &Bound<'py, PyAny>,
        prev_prefix_len: usize,
        swa_start: usize,
        limit: Option<usize>,
    ) -> PyResult<(usize, u64, Vec<Action<'py>>, bool)> {
        let key_in = to_input64_held(tokens, "tokens")?;
        let vals_in =
            if values.is_none() { None } else { Some(to_input64_held(values, "values")?) };
        let (mut s1, mut s2) = (Vec::new(), Vec::new());
        let key = ints_of(&key_in, "tokens", limit, &mut s1)?;
        let vals = match &vals_in {
            Some(v) => Some(ints_of(v, "values", None, &mut s2)?),
            None => None,
        };
        let r = self.t()?.insert_swa(ns, key, vals, prev_prefix_len, swa_start).py()?;
        let mut out = Vec::with_capacity(r.actions.len());
        for a in r.actions {
            out.push(match a {
                CacheAction::FreeDeviceKv(v) => (0, -1, bytes_of(py, &v)?, None),
                CacheAction::FreeDeviceKvFullOnly(v) => (1, -1, bytes_of(py, &v)?, None),
                CacheAction::SwaRebuild { node, full } => {
                    (2, node as i64, bytes_of(py, &full)?, None)
                }
                CacheAction::RecoverSwaWithLockedFull { node, kept, incoming } => {
                    (3, node as i64, bytes_of(py, &kept)?, Some(bytes_of(py, &incoming)?))
                }
            });
        }
        Ok((r.prefix_len, r.node, out, r.refreshed))
    }

    /// Locks the node's root path; returns the tokens that became protected.
    fn inc_lock_ref(&self, node: u64) -> PyResult<u64> {
        self.t()?.inc_lock_ref(node).py()
    }

    /// Releases a lock taken by `inc_lock_ref`; returns the tokens that became evictable.
    fn dec_lock_ref(&self, node: u64) -> PyResult<u64> {
        self.t()?.dec_lock_ref(node).py()
    }

    /// `(evictable, protected)` FULL tokens.
    fn sizes(&self) -> PyResult<(u64, u64)> {
        let s = self.t()?.sizes();
        Ok((s.evictable, s.protected))
    }

    /// Starts an eviction walk for `request` tokens: the evictable leaves, oldest first.
    fn evict_start(&self, request: u64) -> PyResult<()> {
        self.t()?.evict_start(request);
        Ok(())
    }

    /// The walk's next victim (`None` when done: `evicted` reached the request, or no leaf).
    fn evict_next(&self, evicted: u64) -> PyResult<Option<u64>> {
        self.t()?.evict_next(evicted).py()
    }

    /// Evicts a leaf (deletes it: this core keeps no host copy); returns its device indices
    /// (int64 bytes) for the allocator.
    fn evict_leaf<'py>(&self, py: Python<'py>, node: u64) -> PyResult<Bound<'py, PyByteArray>> {
        let mut t = self.t()?;
        let v = t.evict_leaf(node).py()?;
        let out = bytes_of(py, &v);
        t.recycle(v);
        out
    }

    /// One component's whole eviction walk (`component`: "full", "swa" or "mamba"), as
    /// SGLang's controller drives it, for at least `n` of it (tokens; Mamba: state slots):
    /// `(evicted, freed)`, `freed` a list of `(component, int64 bytes)` for the caller's
    /// pools: every leaf evicted whole gives its FULL indices, its SWA slots (by FULL index)
    /// and its Mamba state; a tombstone its component's value (an SWA tombstone also the
    /// node's Mamba state). For engines that do not drive the step-wise walk themselves.
    fn evict<'py>(&self, py: Python<'py>, component: &str, n: u64) -> PyResult<FreedOut<'py>> {
        let c = match component {
            "full" => Component::Full,
            "swa" => Component::Swa,
            "mamba" => Component::Mamba,
            other => {
                return Err(PyValueError::new_err(format!(
                    "evict: component {other:?} is not one of \"full\", \"swa\", \"mamba\"; \
                     nothing was evicted"
                )));
            }
        };
        let mut freed = Vec::new();
        let r = self.t()?.evict(c, n, &mut freed);
        // What was freed before a refusal (a bug) is still the caller's: raise after it.
        let evicted = r.py()?;
        let mut out = Vec::with_capacity(freed.len());
        for f in freed {
            let name = match f.component {
                Component::Full => "full",
                Component::Swa => "swa",
                Component::Mamba => "mamba",
            };
            out.push((name, bytes_of(py, &f.indices)?));
        }
        Ok((evicted, out))
    }

    /// Ends the eviction walk.
    fn evict_end(&self) -> PyResult<()> {
        self.t()?.evict_end();
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
        let chunks = t.collect_indices(from_node, until_node).py()?;
        bytes_of_parts(py, &chunks)
    }

    /// Whether the node has no FULL device value (the root never).
    fn is_evicted(&self, node: u64) -> PyResult<bool> {
        self.t()?.is_evicted(node).py()
    }

    /// Whether `node` is the root.
    fn is_root(&self, node: u64) -> PyResult<bool> {
        self.t()?.is_root(node).py()
    }

    /// `(parent id or -1, key length, value length or -1, lock_ref, child count, last access,
    /// namespace)`.
    fn node_info(&self, node: u64) -> PyResult<(i64, usize, i64, u32, usize, f64, u32)> {
        let i = self.t()?.node_info(node).py()?;
        Ok((
            i.parent.map_or(-1, |p| p as i64),
            i.key_len,
            i.value_len.map_or(-1, |n| n as i64),
            i.lock_ref,
            i.children,
            i.last_access,
            i.ns,
        ))
    }

    /// The node's children ids, in insertion order.
    fn children<'py>(&self, py: Python<'py>, node: u64) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.t()?.children(node).py()?)
    }

    /// The node's key tokens (int64 bytes).
    fn key<'py>(&self, py: Python<'py>, node: u64) -> PyResult<Bound<'py, PyByteArray>> {
        let t = self.t()?;
        bytes_of(py, t.key(node).py()?)
    }

    /// The node's FULL device value (int64 bytes), or None when evicted.
    fn value<'py>(&self, py: Python<'py>, node: u64) -> PyResult<Option<Bound<'py, PyByteArray>>> {
        let t = self.t()?;
        t.value(node).py()?.map(|v| bytes_of(py, v)).transpose()
    }

    /// Every node id, depth first from the root in child order (the root first).
    fn dfs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.t()?.dfs())
    }

    /// Why the tree is inconsistent (sizes against a recount, leaf set, lock refs, parent
    /// links), or None.
    fn check(&self) -> PyResult<Option<String>> {
        Ok(self.t()?.check())
    }
}
