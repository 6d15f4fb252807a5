//! `radixkv._radixkv.NativeTieredCache`: a `radixkv::Cache` built with a host tier
//! (`Cache::with_host`: a device cache with its pool and a host tier, SGLang HiCache's
//! semantics) for Python.
//!
//! As `NativeCache` (see `cache.rs`): every call into the cache runs with the GIL released,
//! arguments converted first and results built after; `close()` refuses new calls at once,
//! waits for the calls in flight, releases the outstanding locks and drops the cache
//! (which waits for its copies in flight). Locks live in a handle table; load-back tickets
//! are the core's numbers (an unknown or taken one is refused by the core).
//!
//! Copiers: `"none"` (`NullCopier`, the index alone) or `"host"` (`HostCopier` between two
//! host KV stores of one layout but for their slot counts, `pool_slots` and `host_slots`),
//! whose bytes Python reads and writes a slot at a time (`read_slot`/`write_slot`) or in
//! place at the stores' addresses (`kv_ptrs`).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use radixkv::events::Medium;
use radixkv::events::hash::HashMode;
use radixkv::kv::{HostKvStorage, KvLayout, KvStorage};
use radixkv::tier::{
    HostCopier, LoadOutcome, LoadTicket, Loaded, NullCopier, TierCopier, TierOptions, WritePolicy,
};
use radixkv::tree::DEFAULT_SLRU_THRESHOLD;
use radixkv::{Cache, CacheOptions, EventOptions, EvictionPolicy};

use crate::cache::{
    LockTable, event_rows, oor, options, pair_len, slot_buffer, tokens_of, with_two,
};
use crate::closable::Closable;
use crate::errors::*;
use crate::input::to_input;

fn no_events() -> Fail {
    fail(
        INVALID_ARGUMENT,
        "events are not enabled on this cache (create it with TieredCache(..., events=True))",
    )
}

fn no_kv() -> Fail {
    fail(
        INVALID_ARGUMENT,
        "this cache has no KV bytes (copier \"none\"): make it with copier=\"host\" and a kv_layout",
    )
}

/// What a finished load-back hands Python: `(handle, lock length, slots, device_len,
/// loaded, outcome)`.
type LoadedRow<'py> = (u64, usize, Bound<'py, PyAny>, usize, usize, &'static str);

/// A two-level cache (see the module docs).
#[pyclass(frozen, module = "radixkv._radixkv")]
pub struct NativeTieredCache {
    inner: Closable<Cache>,
    locks: LockTable,
    /// The host copier's stores (copier "host").
    host_copier: Option<Arc<HostCopier>>,
    #[pyo3(get)]
    page_size: usize,
    #[pyo3(get)]
    pool_slots: usize,
    #[pyo3(get)]
    host_slots: usize,
    #[pyo3(get)]
    events: bool,
}

fn outcome_name(o: LoadOutcome) -> &'static str {
    match o {
        LoadOutcome::Loaded => "loaded",
        LoadOutcome::NothingOnHost => "nothing_on_host",
        LoadOutcome::TooShort => "too_short",
    }
}

/// The options of the host tier `c` was built with ([`Cache::with_host`]: every
/// `NativeTieredCache` has one).
fn tier_options(c: &Cache) -> TierOptions {
    c.tier_options().expect("a NativeTieredCache is built with a host tier")
}

impl NativeTieredCache {
    /// Runs `f` on the cache with the GIL released; `function` names the operation in an
    /// error's message.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        function: &str,
        f: impl FnOnce(&Cache) -> Res<T> + Send,
    ) -> PyResult<T> {
        self.inner.with(py, function, f)
    }

    fn store(&self, side: &str) -> Res<&Arc<HostKvStorage>> {
        let c = self.host_copier.as_ref().ok_or_else(no_kv)?;
        match side {
            "device" => Ok(c.device()),
            "host" => Ok(c.host()),
            s => Err(fail(
                INVALID_ARGUMENT,
                format!("side must be \"device\" or \"host\", got {s:?}"),
            )),
        }
    }

    /// A finished load-back as a row, its lock put in the handle table.
    fn loaded_row<'py>(&self, py: Python<'py>, l: Loaded) -> PyResult<LoadedRow<'py>> {
        let n = l.lock.len();
        let h = self.locks.insert(l.lock);
        Ok((h, n, slot_buffer(py, &l.slots)?, l.device_len, l.loaded, outcome_name(l.outcome)))
    }
}

#[pymethods]
impl NativeTieredCache {
    /// `policy`, `host_policy`: eviction policy names (`host_policy` None: the device's);
    /// `write_policy`: SGLang's names; `copier`: `"none"` or `"host"` (then `kv` =
    /// `(num_layers, num_kv_heads, head_dim, elem_bytes)` is required); `events`:
    /// `(hash_mode, medium, max_drain_batches)` as `NativeCache`'s.
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (page_size, pool_slots, policy, host_slots, write_policy, write_threshold, load_back_min, host_policy=None, copier="none", kv=None, events=None, slru_threshold=None))]
    fn new(
        py: Python<'_>,
        page_size: u64,
        pool_slots: u64,
        policy: &str,
        host_slots: u64,
        write_policy: &str,
        write_threshold: u32,
        load_back_min: u64,
        host_policy: Option<&str>,
        copier: &str,
        kv: Option<(usize, usize, usize, usize)>,
        events: Option<(u32, u32, u64)>,
        slru_threshold: Option<u32>,
    ) -> PyResult<Self> {
        let r = (|| {
            let bad = |m: String| Err(fail(INVALID_ARGUMENT, m));
            let policy: EvictionPolicy = match policy.parse() {
                Ok(p) => p,
                Err(e) => return bad(format!("policy: {e}")),
            };
            let host_policy: Option<EvictionPolicy> = match host_policy.map(str::parse) {
                None => None,
                Some(Ok(p)) => Some(p),
                Some(Err(e)) => return bad(format!("host_policy: {e}")),
            };
            let write_policy = WritePolicy::parse(write_policy).map_err(st)?;
            if page_size == 0 || page_size >= 1 << 32 {
                return bad(format!("page_size = {page_size} must be in [1, 2^32)"));
            }
            if pool_slots == 0 || pool_slots > 1 << 32 || !pool_slots.is_multiple_of(page_size) {
                return bad(format!(
                    "pool_slots = {pool_slots} must be a positive multiple of page_size = \
                     {page_size}, at most 2^32 (a host tier needs the device pool)"
                ));
            }
            if host_slots > 1 << 32 {
                return bad(format!("host_slots = {host_slots} is above 2^32"));
            }
            let copier_arc: Arc<dyn TierCopier>;
            let mut host_copier = None;
            match (copier, kv) {
                ("none", None) => copier_arc = Arc::new(NullCopier::default()),
                ("none", Some(_)) => {
                    return bad(
                        "kv_layout is for copier \"host\" (copier \"none\" has no bytes)".into()
                    );
                }
                ("host", None) => return bad("copier \"host\" needs a kv_layout".into()),
                ("host", Some((layers, heads, dim, elem))) => {
                    let store = |slots: u64, what: &str| -> Res<Arc<HostKvStorage>> {
                        let l = KvLayout::new(layers, slots as usize, heads, dim, elem);
                        HostKvStorage::new(l)
                            .map(Arc::new)
                            .map_err(|e| fail(status_of(&e), format!("kv_layout ({what}): {e}")))
                    };
                    let dev = store(pool_slots, "device")?;
                    // host_slots = 0 is refused by the tier below, with its own message.
                    let host = store(host_slots.max(1), "host")?;
                    let c = Arc::new(HostCopier::new(dev, host));
                    host_copier = Some(c.clone());
                    copier_arc = c;
                }
                (c, _) => return bad(format!("copier must be \"none\" or \"host\", got {c:?}")),
            }
            let dev_opts = CacheOptions {
                page_size: page_size as usize,
                policy,
                pool_slots: pool_slots as usize,
                slru_threshold: slru_threshold.unwrap_or(DEFAULT_SLRU_THRESHOLD),
            };
            let tier = TierOptions {
                host_slots: host_slots as usize,
                write_policy,
                write_threshold,
                load_back_min: usize::try_from(load_back_min).unwrap_or(usize::MAX),
                host_policy,
            };
            let mut cache = Cache::with_host(dev_opts, tier, copier_arc)
                .map_err(|e| fail(status_of(&e), format!("opts: {e}")))?;
            if let Some((hash_mode, medium, max_drain_batches)) = events {
                let hash_mode = match hash_mode {
                    0 => HashMode::Xxh3,
                    1 => HashMode::SglangSha256,
                    h => return bad(format!("events.hash_mode = {h} is not a hash mode")),
                };
                let medium = match medium {
                    0 => Medium::Gpu,
                    1 => Medium::CpuPinned,
                    m => return bad(format!("events.medium = {m} is not a medium")),
                };
                let max_drain_batches = usize::try_from(max_drain_batches).unwrap_or(usize::MAX);
                cache
                    .enable_events(EventOptions { hash_mode, medium, max_drain_batches })
                    .map_err(st)?;
            }
            Ok((cache, host_copier))
        })();
        let (cache, host_copier) = done(py, "rkv_tier_new", r)?;
        Ok(NativeTieredCache {
            page_size: cache.page_size(),
            pool_slots: pool_slots as usize,
            host_slots: host_slots as usize,
            events: events.is_some(),
            inner: Closable::new(cache),
            locks: LockTable::new(),
            host_copier,
        })
    }

    /// Refuses new calls, waits for those in flight, releases the outstanding locks and
    /// frees the cache (waiting for its copies). Idempotent.
    fn close(&self, py: Python<'_>) {
        self.inner.close(py, |c| {
            c.wait_all();
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

    /// The write policy's SGLang name.
    #[getter]
    fn write_policy(&self, py: Python<'_>) -> PyResult<&'static str> {
        self.with(py, "rkv_tier_options", |c| Ok(tier_options(c).write_policy.name()))
    }

    // -- matching --

    /// `(device_len, host_len, slots)`: the device prefix (not pinned) and how far host
    /// copies extend it.
    fn match_prefix<'py>(
        &self,
        py: Python<'py>,
        ns: u64,
        tokens: &Bound<'py, PyAny>,
    ) -> PyResult<(usize, usize, Bound<'py, PyAny>)> {
        let t = tokens_of(tokens)?;
        let tv = t.view();
        let (m, out) = self.with(py, "rkv_tier_match", |c| {
            let mut sc = Vec::new();
            let toks = tv.get("tokens", &mut sc).map_err(oor)?;
            let mut out = Vec::with_capacity(toks.len());
            let m = c.lookup(ns, toks, &mut out);
            Ok((m, out))
        })?;
        drop(t);
        Ok((m.device_len, m.host_len, slot_buffer(py, &out)?))
    }

    /// Match and pin the device prefix: `(handle, device_len, host_len, slots)`.
    fn match_lock<'py>(
        &self,
        py: Python<'py>,
        ns: u64,
        tokens: &Bound<'py, PyAny>,
    ) -> PyResult<(u64, usize, usize, Bound<'py, PyAny>)> {
        let t = tokens_of(tokens)?;
        let tv = t.view();
        let (h, m, out) = self.with(py, "rkv_tier_match_lock", |c| {
            let mut sc = Vec::new();
            let toks = tv.get("tokens", &mut sc).map_err(oor)?;
            let mut out = Vec::with_capacity(toks.len());
            let (lock, m) = c.lookup_and_lock(ns, toks, &mut out);
            Ok((self.locks.insert(lock.into_raw()), m, out))
        })?;
        drop(t);
        Ok((h, m.device_len, m.host_len, slot_buffer(py, &out)?))
    }

    /// Releases the lock `handle` (`InvalidLockError` if it is not a held lock).
    fn release(&self, py: Python<'_>, handle: u64) -> PyResult<()> {
        self.with(py, "rkv_release", |c| {
            let l = self.locks.remove(handle).ok_or_else(|| {
                fail(INVALID_LOCK, format!("lock {handle:#x} {}", self.locks.explain(handle)))
            })?;
            c.release(l).map_err(|e| fail(status_of(&e), format!("lock {handle:#x}: {e}")))
        })
    }

    // -- the device pool --

    /// `n` device slots, all or nothing, evicting (through the host tier) when short.
    fn alloc<'py>(&self, py: Python<'py>, n: u64) -> PyResult<Bound<'py, PyAny>> {
        let out = self.with(py, "rkv_alloc", |c| {
            let cap = self.pool_slots;
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            if n > cap {
                return Err(more_than_pool(n, cap));
            }
            let mut out = Vec::with_capacity(n);
            c.alloc(n, &mut out).map_err(|e| alloc_refusal(e, n, c.page_size()))?;
            Ok(out)
        })?;
        slot_buffer(py, &out)
    }

    /// Gives allocated, never inserted device slots back (refused whole).
    fn free(&self, py: Python<'_>, slots: &Bound<'_, PyAny>) -> PyResult<()> {
        let s = to_input(slots, "slots")?;
        let sv = s.view();
        self.with(py, "rkv_free", |c| {
            let mut sc = Vec::new();
            let sl = sv.get("slots", &mut sc).map_err(oor)?;
            c.free(sl).map_err(|e| slot_refusal(e, Given::Slots(sl), c.pool()))
        })
    }

    // -- inserting --

    /// Caches `tokens` with device `slots` and backs pages up as the write policy says;
    /// returns how many leading tokens were cached already.
    #[pyo3(signature = (ns, tokens, slots, priority=0))]
    fn insert(
        &self,
        py: Python<'_>,
        ns: u64,
        tokens: &Bound<'_, PyAny>,
        slots: &Bound<'_, PyAny>,
        priority: i64,
    ) -> PyResult<usize> {
        let opts = done(py, "rkv_tier_insert", options(priority, 0))?;
        let t = tokens_of(tokens)?;
        let s = to_input(slots, "slots")?;
        done(py, "rkv_tier_insert", pair_len(&t, &s))?;
        let (tv, sv) = (t.view(), s.view());
        self.with(py, "rkv_tier_insert", |c| {
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
        let opts = done(py, "rkv_tier_insert_lock", options(priority, 0))?;
        let t = tokens_of(tokens)?;
        let s = to_input(slots, "slots")?;
        done(py, "rkv_tier_insert_lock", pair_len(&t, &s))?;
        let (tv, sv) = (t.view(), s.view());
        self.with(py, "rkv_tier_insert_lock", |c| {
            with_two(tv, sv, |toks, sl| {
                let (e, l) = c
                    .insert_and_lock(ns, toks, sl, opts)
                    .map_err(|e| slot_refusal(e, Given::Slots(sl), c.pool()))?;
                let n = l.len();
                Ok((e, self.locks.insert(l.into_raw()), n))
            })
        })
    }

    // -- eviction --

    /// Evicts at least `n` device tokens (host copies stay; `write_back` copies first):
    /// the tokens freed.
    fn evict(&self, py: Python<'_>, n: u64) -> PyResult<usize> {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        self.with(py, "rkv_tier_evict", |c| c.evict(n, None).map_err(st))
    }

    /// Evicts at least `n` host tokens (host-only leaves): the host tokens freed.
    fn evict_host(&self, py: Python<'_>, n: u64) -> PyResult<usize> {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        self.with(py, "rkv_tier_evict_host", |c| c.evict_host(n).map_err(st))
    }

    // -- load-back --

    /// Starts loading back the host pages that extend the device match of `tokens` (at
    /// most `max_tokens`): the ticket number.
    fn load_back(
        &self,
        py: Python<'_>,
        ns: u64,
        tokens: &Bound<'_, PyAny>,
        max_tokens: u64,
    ) -> PyResult<u64> {
        let t = tokens_of(tokens)?;
        let tv = t.view();
        let max = usize::try_from(max_tokens).unwrap_or(usize::MAX);
        self.with(py, "rkv_tier_load_back", |c| {
            let mut sc = Vec::new();
            let toks = tv.get("tokens", &mut sc).map_err(oor)?;
            let pool = self.pool_slots;
            c.load_back(ns, toks, max).map(|t| t.0).map_err(|e| match e {
                radixkv::Error::OutOfSlots { .. } => fail(
                    OUT_OF_SLOTS,
                    format!(
                        "the device pool ({pool} slots) cannot hold the pages to load back, \
                         even after evicting all that is evictable: {e}"
                    ),
                ),
                e => st(e),
            })
        })
    }

    /// Waits for a load-back and takes its result: `(handle, length, slots, device_len,
    /// loaded, outcome)`.
    fn wait_load<'py>(&self, py: Python<'py>, ticket: u64) -> PyResult<LoadedRow<'py>> {
        let l =
            self.with(py, "rkv_tier_wait_load", |c| c.wait_load(LoadTicket(ticket)).map_err(st))?;
        self.loaded_row(py, l)
    }

    /// The load-back's result if it is done (taking it), else None.
    fn try_load<'py>(&self, py: Python<'py>, ticket: u64) -> PyResult<Option<LoadedRow<'py>>> {
        let r = self.with(py, "rkv_tier_try_load", |c| match c.try_load(LoadTicket(ticket)) {
            None => Ok(None),
            Some(r) => r.map(Some).map_err(st),
        })?;
        r.map(|l| self.loaded_row(py, l)).transpose()
    }

    /// Finishes the copies that are done: how many.
    fn poll(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, "rkv_tier_poll", |c| Ok(c.poll()))
    }

    /// Waits for every copy in flight.
    fn wait_all(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, "rkv_tier_wait_all", |c| {
            c.wait_all();
            Ok(())
        })
    }

    // -- stats --

    /// The tier's counts and counters as a dict (the device cache's under `"device"`, as
    /// `NativeCache.stats`'s tuple).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (s, ns) = self.with(py, "rkv_tier_stats", |c| {
            Ok((c.tier_stats().expect("built with a tier"), c.tree().namespace_count()))
        })?;
        let d = PyDict::new(py);
        let t = s.device.tree;
        let dev = (
            t.cached_tokens,
            t.evictable_tokens,
            t.protected_tokens,
            t.nodes,
            s.device.pool_slots,
            s.device.free_slots,
            t.match_calls,
            t.match_query_tokens,
            t.match_hit_tokens,
            t.inserted_tokens,
            t.evicted_tokens,
            ns,
        );
        d.set_item("device", dev)?;
        for (k, v) in [
            ("host_slots", s.host_slots),
            ("host_free_slots", s.host_free_slots),
            ("host_backed_slots", s.host_backed_slots),
            ("host_resident_pages", s.host_resident_pages),
            ("host_pinned_pages", s.host_pinned_pages),
            ("host_evictable_pages", s.host_evictable_pages),
            ("device_hit_tokens", s.device_hit_tokens),
            ("host_hit_tokens", s.host_hit_tokens),
            ("tokens_to_host", s.tokens_to_host),
            ("tokens_written_back", s.tokens_written_back),
            ("tokens_to_device", s.tokens_to_device),
            ("copies_to_host", s.copies_to_host),
            ("copies_to_device", s.copies_to_device),
            ("copy_failures", s.copy_failures),
            ("load_backs", s.load_backs),
            ("load_backs_skipped", s.load_backs_skipped),
            ("host_evicted_pages", s.host_evicted_pages),
            ("in_flight", s.in_flight),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// The tier's and the device tree's invariants at quiescence: None when they hold,
    /// else what is wrong.
    fn check(&self, py: Python<'_>) -> PyResult<Option<String>> {
        self.with(py, "rkv_tier_check", |c| {
            if let Some(Err(e)) = c.check_tier() {
                return Ok(Some(e));
            }
            Ok(c.tree().check_invariants().err().map(|e| e.to_string()))
        })
    }

    // -- KV events --

    /// Closes the events so far into a batch: its sequence number, or None.
    fn flush_events(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        self.with(py, "rkv_events_flush", |c| {
            c.events().ok_or_else(no_events)?;
            Ok(c.flush_events())
        })
    }

    /// Takes every closed batch, as `NativeCache.drain_events`.
    #[pyo3(signature = (signed=false))]
    fn drain_events<'py>(&self, py: Python<'py>, signed: bool) -> PyResult<Bound<'py, PyList>> {
        let batches = self.with(py, "rkv_events_drain", |c| {
            c.events().ok_or_else(no_events)?;
            Ok(c.drain_events())
        })?;
        event_rows(py, batches, signed)
    }

    // -- KV bytes (copier "host") --

    /// `(num_layers, num_kv_heads, head_dim, elem_bytes, slot_bytes)`, or None without
    /// KV bytes.
    fn kv_layout(&self) -> Option<(usize, usize, usize, usize, usize)> {
        let l = *self.host_copier.as_ref()?.device().layout();
        Some((l.num_layers, l.num_kv_heads, l.head_dim, l.elem_bytes, l.slot_bytes()))
    }

    /// The `(K, V)` buffer addresses of every layer of the `side` store (`"device"` or
    /// `"host"`): each buffer is `[num_slots, num_kv_heads, head_dim]` elements.
    fn kv_ptrs(&self, py: Python<'_>, side: &str) -> PyResult<Vec<(u64, u64)>> {
        let r = (|| {
            let s = self.store(side)?;
            (0..s.layout().num_layers)
                .map(|l| Ok((s.k_ptr(l).map_err(st)?, s.v_ptr(l).map_err(st)?)))
                .collect::<Res<Vec<_>>>()
        })();
        done(py, "rkv_kv_ptrs", r)
    }

    /// Slot `slot`'s K and V bytes at layer `layer` of the `side` store.
    fn read_slot<'py>(
        &self,
        py: Python<'py>,
        side: &str,
        layer: usize,
        slot: u32,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        let s = done(py, "rkv_kv_read_slot", self.store(side))?.clone();
        self.inner.refuse_if_closing(py, "rkv_kv_read_slot")?;
        let n = s.layout().slot_bytes();
        let r = py.detach(|| {
            let (mut k, mut v) = (vec![0u8; n], vec![0u8; n]);
            s.read_slot(layer, slot, &mut k, &mut v).map(|()| (k, v)).map_err(st)
        });
        let (k, v) = done(py, "rkv_kv_read_slot", r)?;
        Ok((PyBytes::new(py, &k), PyBytes::new(py, &v)))
    }

    /// Writes slot `slot`'s K and V bytes (each `slot_bytes` long) at layer `layer` of
    /// the `side` store.
    fn write_slot(
        &self,
        py: Python<'_>,
        side: &str,
        layer: usize,
        slot: u32,
        k: Vec<u8>,
        v: Vec<u8>,
    ) -> PyResult<()> {
        let s = done(py, "rkv_kv_write_slot", self.store(side))?.clone();
        self.inner.refuse_if_closing(py, "rkv_kv_write_slot")?;
        let r = py.detach(|| s.write_slot(layer, slot, &k, &v).map_err(st));
        done(py, "rkv_kv_write_slot", r)
    }
}
