//! `radixkv._radixkv.NativeCache`: a `radixkv::Cache` for Python.
//!
//! Every call into the tree runs with the GIL released (`Python::detach`): arguments are
//! converted first (see `input.rs`; buffers stay borrowed, their memory is read without the
//! GIL), the tree call and any conversion of the result's memory run detached, and the
//! Python result is built after. Callbacks never run inside the tree: slots a call frees are
//! collected and handed back as one buffer when it returns.
//!
//! Lifetime: `close()` refuses new calls at once (a flag checked before anything else),
//! then takes the cache's write lock with the GIL released, which waits for the calls in
//! flight (each holds the read lock only while detached), releases the outstanding locks
//! and drops the cache.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyList};
use radixkv::events::NamespaceMeta;
use radixkv::tier::HostCopier;
use radixkv::tree::{InsertOptions, Key, checked_priority};
use radixkv::{Cache, PrefixLock, SlotRun};

use crate::closable::Closable;
use crate::errors::*;
pub(crate) use crate::event_rows::event_rows;
use crate::input::{
    Input, OutOfRange, View, to_input, to_input_span_held, to_runs, to_shared_span,
};
pub(crate) use crate::locks::LockTable;
pub use crate::prefix::Prefix;
use crate::prefix::runs_cut;
use crate::slots::{SLOT_BUFFER, bytearray_filled, clear_runs, mark, mark_runs, runs_list};
pub use crate::slots::{i64_bytes, i64_bytes_of_runs, register_slot_buffer, slot_buffer};

pub(crate) fn oor(e: OutOfRange) -> Fail {
    fail(
        VALUE,
        format!("{}[{}] = {} is out of range: ids must be in [0, 2**32)", e.what, e.index, e.value),
    )
}

fn no_events(function: &str) -> Fail {
    let _ = function;
    fail(
        INVALID_ARGUMENT,
        "events are not enabled on this cache (create it with Cache(..., events=True))",
    )
}

/// A radixkv cache (see the module docs).
#[pyclass(frozen, module = "radixkv._radixkv")]
pub struct NativeCache {
    pub(crate) inner: Closable<Cache>,
    pub(crate) locks: LockTable,
    /// The host copier's stores (a host tier with copier "host"; `tier::NativeTier`).
    pub(crate) host_copier: Option<Arc<HostCopier>>,
    /// Its live requests (`requests::NativeRequests`, `Cache.admit`).
    pub(crate) requests: crate::requests::RequestTable,
    #[pyo3(get)]
    page_size: usize,
    #[pyo3(get)]
    pool_slots: usize,
    #[pyo3(get)]
    events: bool,
    /// Caller-managed mode, when asked for: which slots the tree holds (a bitmap), kept by
    /// the inserts and evictions of this object (`cached_slots_i64`).
    tracked: Option<Mutex<Vec<u64>>>,
}

type Stats12 = (u64, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64);

impl NativeCache {
    /// Runs `f` on the cache with the GIL released (see the module docs); `function` names
    /// the operation in an error's message.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        function: &str,
        f: impl FnOnce(&Cache) -> Res<T> + Send,
    ) -> PyResult<T> {
        self.inner.with(py, function, f)
    }

    fn untrack(&self, freed: &[u32]) {
        if let Some(t) = &self.tracked {
            mark(t, freed.iter().copied(), false);
        }
    }

    fn hold(&self, lock: PrefixLock) -> (u64, usize) {
        let n = lock.len();
        (self.locks.insert(lock), n)
    }

    fn release_in(&self, c: &Cache, handle: u64) -> Res<()> {
        let l = self.locks.remove(handle).ok_or_else(|| {
            fail(INVALID_LOCK, format!("lock {handle:#x} {}", self.locks.explain(handle)))
        })?;
        c.release(l).map_err(|e| fail(status_of(&e), format!("lock {handle:#x}: {e}")))
    }
}

/// An insert's options: `priority` checked to fit the tree's `i32`.
pub(crate) fn options(priority: i64, inserted_len: usize) -> Res<InsertOptions> {
    let priority = checked_priority(priority).map_err(st)?;
    Ok(InsertOptions { priority, inserted_len })
}

pub(crate) fn tokens_of(obj: &Bound<'_, PyAny>) -> PyResult<Input> {
    to_input(obj, "tokens")
}

pub(crate) fn pair_len(t: &Input, s: &Input) -> Res<()> {
    if t.len() != s.len() {
        return Err(fail(
            INVALID_ARGUMENT,
            format!("tokens and slots differ in length ({} != {})", t.len(), s.len()),
        ));
    }
    Ok(())
}

/// Reads both views (tokens, then slots) and runs `f` on them.
pub(crate) fn with_two<T>(
    t: View<'_>,
    s: View<'_>,
    f: impl FnOnce(&[u32], &[u32]) -> Res<T>,
) -> Res<T> {
    with_two_named(t, s, "slots", f)
}

/// [`with_two`], the slots' argument called `slots_name` in errors.
fn with_two_named<T>(
    t: View<'_>,
    s: View<'_>,
    slots_name: &'static str,
    f: impl FnOnce(&[u32], &[u32]) -> Res<T>,
) -> Res<T> {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let toks = t.get("tokens", &mut a).map_err(oor)?;
    let slots = s.get(slots_name, &mut b).map_err(oor)?;
    f(toks, slots)
}

#[pymethods]
impl NativeCache {
    /// `policy`: an eviction policy name (`lru`, `fifo`, and whatever else the library
    /// knows); `events`: `(hash_mode, medium, max_drain_batches)` with hash_mode 0 = XXH3,
    /// 1 = SGLang's SHA-256 and medium 0 = GPU, 1 = CPU_PINNED, or None.
    #[new]
    /// `track_slots` (caller-managed mode only): keep a bitmap of the slots the tree holds,
    /// for `cached_slots_i64` (what SGLang's `all_values_flatten` needs). `slru_threshold`:
    /// the hits that move a node to SLRU's protected segment (default 2, SGLang's). `host`:
    /// the host tier's options (`tier::HostArgs`; `Cache::with_host`), or None.
    /// `swa_window`: a hybrid model's sliding window in tokens (0: none; see
    /// `CacheOptions::swa_window`).
    #[pyo3(signature = (page_size, pool_slots, policy, events=None, track_slots=false, slru_threshold=None, host=None, swa_window=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        page_size: u64,
        pool_slots: u64,
        policy: &str,
        events: Option<(u32, u32, u64)>,
        track_slots: bool,
        slru_threshold: Option<u32>,
        host: Option<crate::tier::HostArgs>,
        swa_window: u64,
    ) -> PyResult<Self> {
        let r = crate::cache_new::build(
            page_size,
            pool_slots,
            policy,
            events,
            slru_threshold,
            swa_window,
            host,
        );
        let (cache, host_copier) = done(py, "Cache", r)?;
        Ok(NativeCache {
            page_size: cache.page_size(),
            pool_slots: cache.options().pool_slots,
            events: cache.events().is_some(),
            tracked: (track_slots && pool_slots == 0).then(|| Mutex::new(Vec::new())),
            inner: Closable::new(cache),
            locks: LockTable::new(),
            host_copier,
            requests: Default::default(),
        })
    }

    /// Refuses new calls, waits for those in flight and for the host tier's copies in
    /// flight, releases the outstanding locks and frees the cache. Idempotent.
    fn close(&self, py: Python<'_>) {
        self.inner.close(py, |c| {
            c.wait_all();
            self.requests.abort_all(&c);
            for l in self.locks.drain() {
                let _ = c.release(l);
            }
        });
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.closed()
    }

    /// Whether calls are refused (closing or closed).
    #[getter]
    fn closing(&self) -> bool {
        self.inner.closing()
    }

    // -- matching --

    /// Slots of the longest cached prefix, as a `SlotBuffer`.
    fn r#match<'py>(
        &self,
        py: Python<'py>,
        ns: u64,
        tokens: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let t = tokens_of(tokens)?;
        let tv = t.view();
        let out = self.with(py, "Cache.match", |c| {
            let mut sc = Vec::new();
            let toks = tv.get("tokens", &mut sc).map_err(oor)?;
            let mut out = Vec::with_capacity(toks.len());
            c.match_prefix(ns, toks, &mut out);
            Ok(out)
        })?;
        drop(t);
        slot_buffer(py, &out)
    }

    /// Length of the longest cached prefix.
    fn match_len(&self, py: Python<'_>, ns: u64, tokens: &Bound<'_, PyAny>) -> PyResult<usize> {
        let t = tokens_of(tokens)?;
        let tv = t.view();
        self.with(py, "Cache.match_len", |c| {
            let mut sc = Vec::new();
            let toks = tv.get("tokens", &mut sc).map_err(oor)?;
            let mut out: Vec<SlotRun> = Vec::new();
            Ok(c.match_prefix(ns, toks, &mut out))
        })
    }

    /// Match lengths of many token arrays in one call (one GIL release for all of them):
    /// a list of ints, in order.
    fn match_len_many<'py>(
        &self,
        py: Python<'py>,
        ns: u64,
        queries: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let mut inputs = Vec::new();
        for (i, q) in queries.try_iter()?.enumerate() {
            let q = q?;
            inputs.push(to_input(&q, "tokens").map_err(|e| {
                let msg = format!("queries[{i}]: {}", e.value(py));
                if e.is_instance_of::<pyo3::exceptions::PyValueError>(py) {
                    pyo3::exceptions::PyValueError::new_err(msg)
                } else {
                    pyo3::exceptions::PyTypeError::new_err(msg)
                }
            })?);
        }
        let views: Vec<View<'_>> = inputs.iter().map(|i| i.view()).collect();
        let lens = self.with(py, "Cache.match_len_many", |c| {
            let (mut sc, mut out) = (Vec::<u32>::new(), Vec::<SlotRun>::new());
            let mut lens = Vec::with_capacity(views.len());
            for v in &views {
                let toks = v.get("tokens", &mut sc).map_err(oor)?;
                out.clear();
                lens.push(c.match_prefix(ns, toks, &mut out));
            }
            Ok(lens)
        })?;
        PyList::new(py, lens)
    }

    /// The match as `(start, length)` runs.
    fn match_runs<'py>(
        &self,
        py: Python<'py>,
        ns: u64,
        tokens: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let t = tokens_of(tokens)?;
        let tv = t.view();
        let runs = self.with(py, "Cache.match_runs", |c| {
            let mut sc = Vec::new();
            let toks = tv.get("tokens", &mut sc).map_err(oor)?;
            let mut out = Vec::new();
            c.match_prefix(ns, toks, &mut out);
            Ok(out)
        })?;
        runs_list(py, &runs)
    }

    /// Match and pin: `(handle, length, slots)`.
    fn match_lock<'py>(
        &self,
        py: Python<'py>,
        ns: u64,
        tokens: &Bound<'py, PyAny>,
    ) -> PyResult<(u64, usize, Bound<'py, PyAny>)> {
        let t = tokens_of(tokens)?;
        let tv = t.view();
        let (h, n, out) = self.with(py, "Cache.match_lock", |c| {
            let mut sc = Vec::new();
            let toks = tv.get("tokens", &mut sc).map_err(oor)?;
            let mut out = Vec::with_capacity(toks.len());
            let lock = c.tree().match_and_lock(ns, toks, &mut out).into_raw();
            let (h, n) = self.hold(lock);
            Ok((h, n, out))
        })?;
        Ok((h, n, slot_buffer(py, &out)?))
    }

    /// Match and pin, the slots as runs: `(handle, length, runs)`.
    fn match_lock_runs<'py>(
        &self,
        py: Python<'py>,
        ns: u64,
        tokens: &Bound<'py, PyAny>,
    ) -> PyResult<(u64, usize, Bound<'py, PyList>)> {
        let t = tokens_of(tokens)?;
        let tv = t.view();
        let (h, n, runs) = self.with(py, "Cache.match_lock_runs", |c| {
            let mut sc = Vec::new();
            let toks = tv.get("tokens", &mut sc).map_err(oor)?;
            let mut out = Vec::new();
            let lock = c.tree().match_and_lock(ns, toks, &mut out).into_raw();
            let (h, n) = self.hold(lock);
            Ok((h, n, out))
        })?;
        Ok((h, n, runs_list(py, &runs)?))
    }

    // -- inserting --

    /// Caches `tokens` with `slots` (at eviction `priority`); returns how many leading
    /// tokens were cached already.
    #[pyo3(signature = (ns, tokens, slots, priority=0))]
    fn insert(
        &self,
        py: Python<'_>,
        ns: u64,
        tokens: &Bound<'_, PyAny>,
        slots: &Bound<'_, PyAny>,
        priority: i64,
    ) -> PyResult<usize> {
        let opts = done(py, "Cache.insert", options(priority, 0))?;
        let t = tokens_of(tokens)?;
        let s = to_input(slots, "slots")?;
        done(py, "Cache.insert", pair_len(&t, &s))?;
        let (tv, sv) = (t.view(), s.view());
        self.with(py, "Cache.insert", |c| {
            with_two(tv, sv, |toks, sl| {
                c.insert_with(ns, toks, sl, opts)
                    .map_err(|e| slot_refusal(e, Given::Slots(sl), c.pool()))
            })
        })
    }

    /// Insert and pin: `(existing, handle, length)`.
    #[pyo3(signature = (ns, tokens, slots, priority=0))]
    fn insert_lock(
        &self,
        py: Python<'_>,
        ns: u64,
        tokens: &Bound<'_, PyAny>,
        slots: &Bound<'_, PyAny>,
        priority: i64,
    ) -> PyResult<(usize, u64, usize)> {
        let opts = done(py, "Cache.insert_lock", options(priority, 0))?;
        let t = tokens_of(tokens)?;
        let s = to_input(slots, "slots")?;
        done(py, "Cache.insert_lock", pair_len(&t, &s))?;
        let (tv, sv) = (t.view(), s.view());
        self.with(py, "Cache.insert_lock", |c| {
            with_two(tv, sv, |toks, sl| {
                let (e, l) = c
                    .insert_and_lock(ns, toks, sl, opts)
                    .map(|(e, l)| (e, l.into_raw()))
                    .map_err(|e| slot_refusal(e, Given::Slots(sl), c.pool()))?;
                let (h, n) = self.hold(l);
                Ok((e, h, n))
            })
        })
    }

    /// Insert with the slots as `(start, length)` runs; returns `existing`.
    #[pyo3(signature = (ns, tokens, runs, priority=0))]
    fn insert_runs(
        &self,
        py: Python<'_>,
        ns: u64,
        tokens: &Bound<'_, PyAny>,
        runs: &Bound<'_, PyAny>,
        priority: i64,
    ) -> PyResult<usize> {
        let opts = done(py, "Cache.insert_runs", options(priority, 0))?;
        let t = tokens_of(tokens)?;
        let r = to_runs(runs, "runs")?;
        let tv = t.view();
        self.with(py, "Cache.insert_runs", |c| {
            let mut sc = Vec::new();
            let toks = tv.get("tokens", &mut sc).map_err(oor)?;
            c.insert_with(ns, toks, &r, opts).map_err(|e| runs_refusal(e, c, &r, toks.len()))
        })
    }

    /// Insert and pin with the slots as runs: `(existing, handle, length)`.
    #[pyo3(signature = (ns, tokens, runs, priority=0))]
    fn insert_lock_runs(
        &self,
        py: Python<'_>,
        ns: u64,
        tokens: &Bound<'_, PyAny>,
        runs: &Bound<'_, PyAny>,
        priority: i64,
    ) -> PyResult<(usize, u64, usize)> {
        let opts = done(py, "Cache.insert_lock_runs", options(priority, 0))?;
        let t = tokens_of(tokens)?;
        let r = to_runs(runs, "runs")?;
        let tv = t.view();
        self.with(py, "Cache.insert_lock_runs", |c| {
            let mut sc = Vec::new();
            let toks = tv.get("tokens", &mut sc).map_err(oor)?;
            let (e, l) = c
                .insert_and_lock(ns, toks, &r, opts)
                .map(|(e, l)| (e, l.into_raw()))
                .map_err(|e| runs_refusal(e, c, &r, toks.len()))?;
            let (h, n) = self.hold(l);
            Ok((e, h, n))
        })
    }

    // -- locks --

    /// Releases the lock `handle` (`InvalidLockError` if it is not a held lock).
    fn release(&self, py: Python<'_>, handle: u64) -> PyResult<()> {
        self.with(py, "Lock.release", |c| self.release_in(c, handle))
    }

    /// `release` returning the status instead of raising (0, or 3 for an invalid lock),
    /// as the C ABI's `rkv_release` does (for `radixkv._native.lib.rkv_release`).
    fn release_status(&self, py: Python<'_>, handle: u64) -> i32 {
        match self.release(py, handle) {
            Ok(()) => 0,
            Err(e) => e
                .value(py)
                .getattr("status")
                .and_then(|s| s.extract::<i32>())
                .unwrap_or(INTERNAL_ERROR),
        }
    }

    /// Tokens the lock `handle` pins.
    fn lock_len(&self, py: Python<'_>, handle: u64) -> PyResult<usize> {
        self.with(py, "Lock.length", |_| {
            self.locks.shard(handle).get(&handle).map(|l| l.len()).ok_or_else(|| {
                fail(INVALID_LOCK, format!("lock {handle:#x} {}", self.locks.explain(handle)))
            })
        })
    }

    // -- eviction and the pool --

    /// Evicts at least `n` tokens; the freed slots as one `SlotBuffer` (taken from the
    /// tree as runs, expanded once).
    fn evict<'py>(&self, py: Python<'py>, n: u64) -> PyResult<Bound<'py, PyAny>> {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        let runs = self.with(py, "Cache.evict", |c| {
            let mut runs = Vec::new();
            c.evict_runs(n, Some(&mut |r: &[SlotRun]| runs.extend_from_slice(r))).map_err(st)?;
            if let Some(t) = &self.tracked {
                clear_runs(t, &runs);
            }
            Ok(runs)
        })?;
        let total: usize = runs.iter().map(|r| r.len as usize).sum();
        let ba = bytearray_filled(py, total * 4, |b| {
            // SAFETY: as in `as_i64s`, for 4-byte values.
            let (pre, out, post) = unsafe { b.align_to_mut::<u32>() };
            assert!(pre.is_empty() && post.is_empty(), "a bytearray buffer aligned to 4 bytes");
            let mut at = 0;
            for r in &runs {
                for (k, x) in out[at..at + r.len as usize].iter_mut().enumerate() {
                    *x = r.start.wrapping_add(k as u32);
                }
                at += r.len as usize;
            }
        })?;
        match SLOT_BUFFER.get(py) {
            Some(cls) => cls.bind(py).call1(("I", ba)),
            None => py.import("array")?.getattr("array")?.call1(("I", ba)),
        }
    }

    /// With a sliding window: frees at least `n` tokens' KV of `target` ("full" or "swa");
    /// `(count, [(full, swa, slots), ...])`, one entry per node with what was freed of it
    /// (`Cache::evict_kv`), the slots as a `SlotBuffer`.
    fn evict_kv<'py>(
        &self,
        py: Python<'py>,
        target: &str,
        n: u64,
    ) -> PyResult<(usize, Bound<'py, PyList>)> {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        let (count, nodes) = self.with(py, "Cache.evict_kv", |c| {
            crate::cache_new::evict_kv(c, target, n, self.tracked.as_ref())
        })?;
        let out = PyList::empty(py);
        for (f, slots) in nodes {
            out.append((f.full, f.swa, slot_buffer(py, &slots)?))?;
        }
        Ok((count, out))
    }

    /// Evicts at least `n` tokens; `(count, freed)` with the freed slots as native int64
    /// bytes (a `bytearray`), for engines whose allocator frees int64 tensors.
    fn evict_i64<'py>(
        &self,
        py: Python<'py>,
        n: u64,
    ) -> PyResult<(usize, Bound<'py, PyByteArray>)> {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        let (count, runs) = self.with(py, "RadixKvCache.evict", |c| {
            let mut runs = Vec::new();
            let count = c
                .evict_runs(n, Some(&mut |r: &[SlotRun]| runs.extend_from_slice(r)))
                .map_err(st)?;
            if let Some(t) = &self.tracked {
                clear_runs(t, &runs);
            }
            Ok((count, runs))
        })?;
        Ok((count, i64_bytes_of_runs(py, &runs)?))
    }

    /// Evicts at least `n` tokens; the freed slots as `(start, length)` runs.
    fn evict_runs<'py>(&self, py: Python<'py>, n: u64) -> PyResult<Bound<'py, PyList>> {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        let runs = self.with(py, "Cache.evict_runs", |c| {
            let mut out = Vec::new();
            c.evict_runs(n, Some(&mut |r: &[SlotRun]| out.extend_from_slice(r))).map_err(st)?;
            if let Some(t) = &self.tracked {
                clear_runs(t, &out);
            }
            Ok(out)
        })?;
        runs_list(py, &runs)
    }

    /// Pool mode: `n` slots, all or nothing, evicting when short.
    fn alloc<'py>(&self, py: Python<'py>, n: u64) -> PyResult<Bound<'py, PyAny>> {
        let out = self.with(py, "Cache.alloc", |c| {
            let pool = c.pool().ok_or_else(no_pool)?;
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            if n > pool.capacity() {
                return Err(more_than_pool(n, pool.capacity()));
            }
            let mut runs = Vec::new();
            c.alloc_runs(n, &mut runs).map_err(|e| alloc_refusal(e, n, c.page_size()))?;
            let mut out = Vec::with_capacity(n);
            for r in &runs {
                out.extend(r.slots());
            }
            Ok(out)
        })?;
        slot_buffer(py, &out)
    }

    /// Pool mode: `n` slots as `(start, length)` runs.
    fn alloc_runs<'py>(&self, py: Python<'py>, n: u64) -> PyResult<Bound<'py, PyList>> {
        let runs = self.with(py, "Cache.alloc_runs", |c| {
            let pool = c.pool().ok_or_else(no_pool)?;
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            if n > pool.capacity() {
                return Err(more_than_pool(n, pool.capacity()));
            }
            let mut runs = Vec::new();
            c.alloc_runs(n, &mut runs).map_err(|e| alloc_refusal(e, n, c.page_size()))?;
            Ok(runs)
        })?;
        runs_list(py, &runs)
    }

    /// Pool mode: gives allocated, never adopted slots back (refused whole).
    fn free(&self, py: Python<'_>, slots: &Bound<'_, PyAny>) -> PyResult<()> {
        let s = to_input(slots, "slots")?;
        let sv = s.view();
        self.with(py, "Cache.free", |c| {
            let mut sc = Vec::new();
            let sl = sv.get("slots", &mut sc).map_err(oor)?;
            let pool = c.pool().ok_or_else(no_pool)?;
            c.free(sl).map_err(|e| slot_refusal(e, Given::Slots(sl), Some(pool)))
        })
    }

    /// Pool mode: `free` for `(start, length)` runs.
    fn free_runs(&self, py: Python<'_>, runs: &Bound<'_, PyAny>) -> PyResult<()> {
        let r = to_runs(runs, "runs")?;
        self.with(py, "Cache.free_runs", |c| {
            let pool = c.pool().ok_or_else(no_pool)?;
            c.free_runs(&r).map_err(|e| {
                if let Some((i, x)) = r.iter().enumerate().find(|(_, x)| x.len == 0) {
                    let m = format!("runs[{i}] = {{start {}, len 0}} is empty", x.start);
                    return fail(INVALID_ARGUMENT, m);
                }
                slot_refusal(e, Given::Runs(&r), Some(pool))
            })
        })
    }

    // -- stats, reset, namespaces --

    /// `(cached, evictable, protected, nodes, pool_slots, free_slots, match_calls,
    /// match_query_tokens, match_hit_tokens, inserted, evicted, namespaces)`.
    fn stats(&self, py: Python<'_>) -> PyResult<Stats12> {
        self.with(py, "Cache.stats", |c| {
            let s = c.stats();
            let t = s.tree;
            Ok((
                t.cached_tokens,
                t.evictable_tokens,
                t.protected_tokens,
                t.nodes,
                s.pool_slots,
                s.free_slots,
                t.match_calls,
                t.match_query_tokens,
                t.match_hit_tokens,
                t.inserted_tokens,
                t.evicted_tokens,
                c.tree().namespace_count(),
            ))
        })
    }

    /// `(cached_tokens, evictable_tokens, protected_tokens)`: the three counters, cheaply.
    fn sizes(&self, py: Python<'_>) -> PyResult<(u64, u64, u64)> {
        self.with(py, "Cache.stats", |c| {
            let t = c.tree().stats();
            Ok((t.cached_tokens, t.evictable_tokens, t.protected_tokens))
        })
    }

    /// Drops every unpinned page (locks stay valid).
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, "Cache.reset", |c| {
            if c.has_pool() {
                c.reset(None)
            } else {
                c.reset(Some(&mut |s: &[u32]| self.untrack(s)))
            }
            .map_err(st)
        })
    }

    /// Empties the cache holding it exclusively (`Cache::clear`): drops every unpinned
    /// page as `reset` does, and with events on publishes one `AllBlocksCleared` when that
    /// leaves the cache empty (the removals otherwise). Waits for the calls in flight; the
    /// calls that start meanwhile wait for it.
    fn clear(&self, py: Python<'_>) -> PyResult<()> {
        self.inner.with_mut(py, "Cache.clear", |c| {
            if c.has_pool() {
                c.clear(None)
            } else {
                c.clear(Some(&mut |s: &[u32]| self.untrack(s)))
            }
            .map_err(st)
        })
    }

    /// Frees memory the index unlinked earlier (a bounded batch).
    fn reclaim(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, "Cache.reclaim", |c| {
            c.reclaim();
            Ok(())
        })
    }

    /// Evicts every unpinned page of `ns`: `(tokens freed, freed slots)`. Without a pool
    /// `want_slots` must be true (the slots are the caller's again).
    fn drop_namespace<'py>(
        &self,
        py: Python<'py>,
        ns: u64,
        want_slots: bool,
    ) -> PyResult<(usize, Bound<'py, PyAny>)> {
        let (n, freed) = self.with(py, "Cache.drop_namespace", |c| {
            if !want_slots && !c.has_pool() {
                return Err(fail(
                    NULL_ARGUMENT,
                    "on_free is None, but this cache has no pool (pool_slots = 0): pass on_free \
                     to get the evicted slots back",
                ));
            }
            let mut freed = Vec::new();
            let n = if want_slots {
                c.drop_namespace(ns, Some(&mut |s: &[u32]| freed.extend_from_slice(s)))
            } else {
                c.drop_namespace(ns, None)
            }
            .map_err(st)?;
            self.untrack(&freed);
            Ok((n, freed))
        })?;
        Ok((n, slot_buffer(py, &freed)?))
    }

    /// `(cached_tokens, evictable_tokens, protected_tokens, nodes)` of `ns`.
    fn namespace_stats(&self, py: Python<'_>, ns: u64) -> PyResult<(u64, u64, u64, u64)> {
        self.with(py, "Cache.namespace_stats", |c| {
            let s = c.namespace_stats(ns);
            Ok((s.cached_tokens, s.evictable_tokens, s.protected_tokens, s.nodes))
        })
    }

    /// Live namespaces.
    fn namespace_count(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, "Cache.namespace_count", |c| Ok(c.tree().namespace_count()))
    }

    // -- KV events --

    /// Names namespace `ns` on the wire, before its first insert.
    #[pyo3(signature = (ns, lora_name=None, cache_salt=None))]
    fn set_namespace_meta(
        &self,
        py: Python<'_>,
        ns: u64,
        lora_name: Option<String>,
        cache_salt: Option<String>,
    ) -> PyResult<()> {
        self.with(py, "Cache.set_namespace_meta", |c| {
            for (name, v) in [("lora_name", &lora_name), ("cache_salt", &cache_salt)] {
                if v.as_deref().is_some_and(|s| s.contains('\0')) {
                    return Err(fail(INVALID_ARGUMENT, format!("{name} holds a NUL character")));
                }
            }
            if c.events().is_none() {
                return Err(no_events("Cache.set_namespace_meta"));
            }
            c.set_namespace_meta(ns, NamespaceMeta { lora_name, cache_salt }).map_err(st)
        })
    }

    /// Closes the events so far into a batch: its sequence number, or None.
    fn flush_events(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        self.with(py, "Cache.flush_events", |c| {
            c.events().ok_or_else(|| no_events("Cache.flush_events"))?;
            Ok(c.flush_events())
        })
    }

    /// Takes every closed batch: a list of `(seq, ts, kind, medium, block_size, parent,
    /// hashes, tokens, lora_name, cache_salt)`, kind 0 stored, 1 removed, 2 cleared; hashes
    /// as unsigned 64-bit ints, or as signed ones with `signed`.
    #[pyo3(signature = (signed=false))]
    fn drain_events<'py>(&self, py: Python<'py>, signed: bool) -> PyResult<Bound<'py, PyList>> {
        let batches = self.with(py, "Cache.events", |c| {
            c.events().ok_or_else(|| no_events("Cache.events"))?;
            Ok(c.drain_events())
        })?;
        event_rows(py, batches, signed)
    }

    /// `(batches, events, dropped)`.
    fn events_stats(&self, py: Python<'_>) -> PyResult<(u64, u64, u64)> {
        self.with(py, "Cache.events_stats", |c| {
            let s = c.events().ok_or_else(|| no_events("Cache.events_stats"))?.stats();
            Ok((s.batches, s.events, s.dropped))
        })
    }

    // -- spans (the SGLang backend's calls: a key is `tokens[start:stop]` of a buffer, read
    // in place, and the results are what SGLang's scheduler needs) --

    /// Length of the longest cached prefix of `tokens[start:stop]` (refreshing its access
    /// stamps, as a match does).
    fn span_match_len(
        &self,
        py: Python<'_>,
        ns: u64,
        tokens: &Bound<'_, PyAny>,
        start: usize,
        stop: usize,
    ) -> PyResult<usize> {
        let t = tokens_of(tokens)?;
        let tv = t.view().narrow(start, stop);
        self.with(py, "RadixKvCache.touch_prefix", |c| {
            let mut sc = Vec::new();
            let toks = tv.get("tokens", &mut sc).map_err(oor)?;
            let mut out: Vec<SlotRun> = Vec::new();
            Ok(c.match_prefix(ns, toks, &mut out))
        })
    }

    /// Slots of the longest cached prefix of `tokens[start:stop]` as native int64 bytes.
    fn span_match_i64<'py>(
        &self,
        py: Python<'py>,
        ns: u64,
        tokens: &Bound<'py, PyAny>,
        start: usize,
        stop: usize,
    ) -> PyResult<Bound<'py, PyByteArray>> {
        let t = tokens_of(tokens)?;
        let tv = t.view().narrow(start, stop);
        let out = self.with(py, "RadixKvCache.path_device_indices", |c| {
            let mut sc = Vec::new();
            let toks = tv.get("tokens", &mut sc).map_err(oor)?;
            let mut out = Vec::with_capacity(toks.len());
            c.match_prefix(ns, toks, &mut out);
            Ok(out)
        })?;
        i64_bytes(py, &out)
    }

    /// Pins the longest cached prefix of `tokens[start:stop]`: `(handle, length, change of
    /// the evictable count)`.
    fn span_lock(
        &self,
        py: Python<'_>,
        ns: u64,
        tokens: &Bound<'_, PyAny>,
        start: usize,
        stop: usize,
    ) -> PyResult<(u64, usize, i64)> {
        let t = tokens_of(tokens)?;
        let tv = t.view().narrow(start, stop);
        self.with(py, "RadixKvCache.inc_lock_ref", |c| {
            let mut sc = Vec::new();
            let toks = tv.get("tokens", &mut sc).map_err(oor)?;
            let before = c.tree().stats().evictable_tokens as i64;
            let mut out: Vec<SlotRun> = Vec::new();
            let lock = c.tree().match_and_lock(ns, toks, &mut out).into_raw();
            let delta = c.tree().stats().evictable_tokens as i64 - before;
            let (h, n) = self.hold(lock);
            Ok((h, n, delta))
        })
    }

    /// Releases the lock `handle`: the change of the evictable count.
    fn span_release(&self, py: Python<'_>, handle: u64) -> PyResult<i64> {
        self.with(py, "RadixKvCache.dec_lock_ref", |c| {
            let before = c.tree().stats().evictable_tokens as i64;
            self.release_in(c, handle)?;
            Ok(c.tree().stats().evictable_tokens as i64 - before)
        })
    }

    /// Caches `tokens[start:stop]` with `values[vstart:vstart + (stop - start)]` at
    /// eviction `priority` (`inserted_len`: tokens of the key the same request inserted
    /// before, which count no hit): returns how many leading tokens were cached already.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (ns, tokens, start, stop, values, vstart, priority=0, inserted_len=0))]
    fn span_insert(
        &self,
        py: Python<'_>,
        ns: u64,
        tokens: &Bound<'_, PyAny>,
        start: usize,
        stop: usize,
        values: &Bound<'_, PyAny>,
        vstart: usize,
        priority: i64,
        inserted_len: usize,
    ) -> PyResult<usize> {
        let opts = done(py, "RadixKvCache.insert", options(priority, inserted_len))?;
        let t = tokens_of(tokens)?;
        let s = to_input(values, "value")?;
        let stop = stop.min(t.len()).max(start.min(t.len()));
        let n = stop - start.min(stop);
        if s.len() < vstart + n {
            return done(
                py,
                "RadixKvCache.insert",
                Err(fail(
                    INVALID_ARGUMENT,
                    format!("{} values for {n} tokens from value[{vstart}]", s.len()),
                )),
            );
        }
        let tv = t.view().narrow(start, stop);
        let sv = s.view().narrow(vstart, vstart + n);
        self.with(py, "RadixKvCache.insert", |c| {
            with_two_named(tv, sv, "value", |toks, sl| {
                let e = c
                    .insert_with(ns, toks, sl, opts)
                    .map_err(|e| slot_refusal(e, Given::Slots(sl), c.pool()))?;
                if let Some(t) = &self.tracked {
                    let aligned = toks.len() / c.page_size() * c.page_size();
                    let mut runs = Vec::new();
                    SlotRun::push_runs_of(&sl[e.min(aligned)..aligned], &mut runs);
                    mark_runs(t, &runs, true);
                }
                Ok(e)
            })
        })
    }

    // -- kept prefixes (the SGLang backend's nodes: the matched tokens converted to u32 once
    // per request, and the slots of the latest match or lock of them) --

    /// As `span_match_len`, and the matched prefix kept: `(length, Prefix or None)`. The
    /// `Prefix` keeps `tokens[start:max(stop, keep_to)]` converted (its first `length`
    /// tokens are the match; `keep_to` past `stop`: the rest of the request's key, which its
    /// checkpoint then takes without converting), on a miss too (length 0); None only for
    /// an empty span.
    #[pyo3(signature = (ns, tokens, start, stop, keep_to=0))]
    fn prefix_match(
        &self,
        py: Python<'_>,
        ns: u64,
        tokens: &Bound<'_, PyAny>,
        start: usize,
        stop: usize,
        keep_to: usize,
    ) -> PyResult<(usize, Option<Prefix>)> {
        let toks = match to_shared_span(tokens, "tokens", start, stop.max(keep_to)) {
            Ok(t) => t,
            // Something past the match's span is not an id: not the match's to refuse (its
            // span converted alone raises what is wrong within it, if anything).
            Err(_) if keep_to > stop => to_shared_span(tokens, "tokens", start, stop)?,
            Err(e) => return Err(e),
        };
        let t = &toks[..toks.len().min(stop.saturating_sub(start))];
        let (m, runs) = self.with(py, "RadixKvCache.match_prefix", |c| {
            let mut runs: Vec<SlotRun> = Vec::new();
            Ok((c.match_prefix(ns, t, &mut runs), runs))
        })?;
        if toks.is_empty() {
            return Ok((0, None));
        }
        // Kept on a miss too: the request's checkpoint takes the converted key.
        Ok((m, Some(Prefix::new(ns, toks, Some(runs)))))
    }

    /// Pins the longest cached prefix of the kept `prefix`'s first `n` tokens (no key is
    /// read again): `(handle, length, change of the evictable count)`; the prefix keeps the
    /// pinned slots.
    fn prefix_lock(
        &self,
        py: Python<'_>,
        prefix: &Bound<'_, Prefix>,
        n: usize,
    ) -> PyResult<(u64, usize, i64)> {
        let p = prefix.get();
        // The lock keeps a share of the prefix's buffer, not a copy of its tokens.
        let key = Key::Shared(&p.toks, n.min(p.toks.len()));
        self.with(py, "RadixKvCache.inc_lock_ref", |c| {
            let before = c.tree().stats().evictable_tokens as i64;
            let mut runs: Vec<SlotRun> = Vec::new();
            let lock = c.tree().match_and_lock(p.ns, key, &mut runs).into_raw();
            let delta = c.tree().stats().evictable_tokens as i64 - before;
            *p.slots.lock().unwrap_or_else(|e| e.into_inner()) = Some(runs);
            let (h, n) = self.hold(lock);
            Ok((h, n, delta))
        })
    }

    /// The first `n` slots the kept `prefix` last matched or pinned, as native int64
    /// bytes (exact while a lock of it is held: pinned slots do not change); with
    /// `rematch`, or when none are kept, matched again first (refreshing its access order,
    /// as a match does).
    #[pyo3(signature = (prefix, n, rematch=false))]
    fn prefix_slots_i64<'py>(
        &self,
        py: Python<'py>,
        prefix: &Bound<'py, Prefix>,
        n: usize,
        rematch: bool,
    ) -> PyResult<Bound<'py, PyByteArray>> {
        let p = prefix.get();
        let runs = self.with(py, "RadixKvCache.path_device_indices", |c| {
            let mut slots = p.slots.lock().unwrap_or_else(|e| e.into_inner());
            if rematch || slots.is_none() {
                let mut runs: Vec<SlotRun> = Vec::new();
                c.match_prefix(p.ns, &p.toks[..n.min(p.toks.len())], &mut runs);
                *slots = Some(runs);
            }
            Ok(runs_cut(slots.as_deref().unwrap_or_default(), 0, n))
        })?;
        i64_bytes_of_runs(py, &runs)
    }

    /// SGLang's checkpoint in one call: caches `tokens[start:stop]` with
    /// `values[vstart:vstart + (stop - start)]` (as `span_insert`), pins the inserted prefix,
    /// in the same walk, then releases the lock `old` (0: none; if it is not a held lock,
    /// the new one is released too and the error raised). Returns `(existing, handle,
    /// pinned length, the tree's slots of positions [dup_from, existing) as native int64
    /// bytes, the pinned prefix kept)`: the slots the caller's row must point at instead of
    /// its duplicates.
    ///
    /// `kept`: the `Prefix` of the request's match (or of its last checkpoint) when it was
    /// made from the same `tokens` object, from the same `start`, in the same namespace, and
    /// the caller's tokens only grow (SGLang's request token arrays are append-only): its
    /// converted tokens are used (shared: the new lock and the returned `Prefix` keep a
    /// reference to the same buffer), and only a part of the span past them is converted
    /// (then into a new buffer). The values are read in place, with the GIL held for the
    /// whole call (no copy of the row; no Python thread can write it meanwhile).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (ns, tokens, start, stop, values, vstart, dup_from, old, priority=0, inserted_len=0, kept=None))]
    fn span_checkpoint<'py>(
        &self,
        py: Python<'py>,
        ns: u64,
        tokens: &Bound<'py, PyAny>,
        start: usize,
        stop: usize,
        values: &Bound<'py, PyAny>,
        vstart: usize,
        dup_from: usize,
        old: u64,
        priority: i64,
        inserted_len: usize,
        kept: Option<&Bound<'py, Prefix>>,
    ) -> PyResult<(usize, u64, usize, Bound<'py, PyByteArray>, Prefix)> {
        let opts = done(py, "RadixKvCache.checkpoint", options(priority, inserted_len))?;
        let toks: Arc<[u32]> = match kept {
            Some(k) if k.get().ns == ns && stop > start => {
                let have = &k.get().toks;
                if have.len() >= stop - start {
                    Arc::clone(have)
                } else {
                    let rest = to_shared_span(tokens, "tokens", start + have.len(), stop)?;
                    have.iter().chain(rest.iter()).copied().collect()
                }
            }
            _ => to_shared_span(tokens, "tokens", start, stop)?,
        };
        let n = (stop - start).min(toks.len());
        // Read in place below, with the GIL held until the call returns.
        let vals = to_input_span_held(values, "value", vstart, vstart + n)?;
        if vals.len() < n {
            return done(
                py,
                "RadixKvCache.checkpoint",
                Err(fail(
                    INVALID_ARGUMENT,
                    format!("{} values for {n} tokens from value[{vstart}]", vals.len() + vstart),
                )),
            );
        }
        let mut scratch = Vec::new();
        let sl = done(
            py,
            "RadixKvCache.checkpoint",
            vals.view()
                .get("value", &mut scratch)
                .map_err(|e| oor(OutOfRange { index: e.index + vstart, ..e })),
        )?;
        let t = &toks[..n];
        let (e, h, locked, dup) = self.inner.with_held(py, "RadixKvCache.checkpoint", |c| {
            // The insert pins what it cached in the same walk; the lock keeps a share of the
            // buffer, not a copy.
            let (e, lock) = c
                .insert_and_lock(ns, Key::Shared(&toks, n), sl, opts)
                .map(|(e, l)| (e, l.into_raw()))
                .map_err(|e| slot_refusal(e, Given::Slots(sl), c.pool()))?;
            let aligned = t.len() / c.page_size() * c.page_size();
            if let Some(tr) = &self.tracked {
                let mut runs = Vec::new();
                SlotRun::push_runs_of(&sl[e.min(aligned)..aligned], &mut runs);
                mark_runs(tr, &runs, true);
            }
            let (h, locked) = self.hold(lock);
            // The tree's slots the caller's duplicates give way to (pinned now: stable).
            let mut dup: Vec<SlotRun> = Vec::new();
            if e > dup_from {
                let mut runs: Vec<SlotRun> = Vec::new();
                c.match_prefix(ns, &t[..e], &mut runs);
                dup = runs_cut(&runs, dup_from, e);
            }
            // The old lock goes only now that the new one holds its prefix (released first,
            // that prefix could be evicted and its freed slots taken for the caller's).
            if old != 0
                && let Err(err) = self.release_in(c, old)
            {
                let _ = self.release_in(c, h);
                return Err(err);
            }
            Ok((e, h, locked, dup))
        })?;
        drop(vals); // the export (or reference) released, with the GIL held
        // The slots are not kept: a later read of the node's indices matches them again.
        let prefix = Prefix::new(ns, toks, None);
        Ok((e, h, locked, i64_bytes_of_runs(py, &dup)?, prefix))
    }

    /// The slots the tree holds (with `track_slots`), ascending, as native int64 bytes.
    fn cached_slots_i64<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyByteArray>> {
        let slots = self.with(py, "cached_slots", |_| {
            let t = self.tracked.as_ref().ok_or_else(|| {
                fail(INVALID_ARGUMENT, "the cache was not made with track_slots=True")
            })?;
            let b = t.lock().unwrap_or_else(|p| p.into_inner());
            let mut out = Vec::new();
            for (w, &bits) in b.iter().enumerate() {
                let mut x = bits;
                while x != 0 {
                    out.push(w as u32 * 64 + x.trailing_zeros());
                    x &= x - 1;
                }
            }
            Ok(out)
        })?;
        i64_bytes(py, &slots)
    }

    /// The tree's invariants at quiescence: None when they hold, else what is wrong.
    fn check_invariants(&self, py: Python<'_>) -> PyResult<Option<String>> {
        self.with(py, "check_invariants", |c| Ok(c.tree().check_invariants().err()))
    }

    /// Starts a ZMQ publisher of this cache's events.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (endpoint, replay_endpoint, topic, encoding, buffer_steps, max_queue, auto_flush_ms, linger_ms, data_parallel_rank, group_idx, kv_cache_spec_kind, sliding_window))]
    fn publish(
        &self,
        py: Python<'_>,
        endpoint: String,
        replay_endpoint: Option<String>,
        topic: String,
        encoding: u32,
        buffer_steps: u64,
        max_queue: u64,
        auto_flush_ms: u64,
        linger_ms: u64,
        data_parallel_rank: i64,
        group_idx: u32,
        kv_cache_spec_kind: String,
        sliding_window: Option<u32>,
    ) -> PyResult<crate::publisher::NativePublisher> {
        self.with(py, "Cache.publish", |c| {
            let sink = c.events().ok_or_else(|| no_events("Cache.publish"))?;
            crate::publisher::start(
                sink,
                crate::publisher::Opts {
                    endpoint,
                    replay_endpoint,
                    topic,
                    encoding,
                    buffer_steps,
                    max_queue,
                    auto_flush_ms,
                    linger_ms,
                    data_parallel_rank,
                    group_idx,
                    kv_cache_spec_kind,
                    sliding_window,
                },
            )
        })
    }
}

/// An insert's refusal of the runs `r` given for `n_tokens` tokens.
fn runs_refusal(e: radixkv::Error, c: &Cache, r: &[SlotRun], n_tokens: usize) -> Fail {
    if let Some(f) = runs_shape(r, n_tokens) {
        return f;
    }
    slot_refusal(e, Given::Runs(r), c.pool())
}
