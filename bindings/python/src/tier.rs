//! The host tier of a `NativeCache` for Python: the options a cache is built with
//! ([`host_parts`], from `Cache(..., host=HostOptions(...))`) and `NativeTier`, the tier's
//! calls on one `NativeCache` (`lookup`, `load_back`, `wait_load`, `evict_host`,
//! `tier_stats`, the KV bytes, ...). A cache built without host options answers them as
//! the core does: [`radixkv::Error::NoTier`] for the tier-only calls (the Python layer
//! refuses them first, naming the method), `host_len == 0` for a lookup.
//!
//! `NativeTier` holds a strong reference to its `NativeCache` and goes through the same
//! door (`Closable::with`: the GIL released, refused once `close()` began), so a tier call
//! and a plain call on one cache see one cache, one lock table and one lifetime.
//!
//! Copiers: `"none"` (`NullCopier`, the index alone) or `"host"` (`HostCopier` between two
//! host KV stores of one layout but for their slot counts, `pool_slots` and `host_slots`),
//! whose bytes Python reads and writes a slot at a time (`read_slot`/`write_slot`) or in
//! place at the stores' addresses (`kv_ptrs`).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use radixkv::kv::{HostKvStorage, KvLayout, KvStorage};
use radixkv::tier::{
    HostCopier, LoadOutcome, LoadTicket, Loaded, NullCopier, TierCopier, TierOptions, WritePolicy,
};
use radixkv::{Cache, EvictionPolicy};

use crate::cache::{NativeCache, oor, slot_buffer, tokens_of};
use crate::errors::*;

/// The host options as the Python layer hands them over: `(host_slots, write_policy,
/// write_threshold, load_back_min, host_policy, copier, kv)`, `kv` =
/// `(num_layers, num_kv_heads, head_dim, elem_bytes)` for copier `"host"`.
pub(crate) type HostArgs =
    (u64, String, u32, u64, Option<String>, String, Option<(usize, usize, usize, usize)>);

/// The tier's options, its copier, and the host copier's stores (copier `"host"`).
pub(crate) type HostParts = (TierOptions, Arc<dyn TierCopier>, Option<Arc<HostCopier>>);

/// What [`Cache::with_host`] needs, from the host options of a cache of `pool_slots`
/// device slots: the tier's options, its copier, and the host copier's stores (copier
/// `"host"`). Every refusal is `INVALID_ARGUMENT` naming the option.
pub(crate) fn host_parts(pool_slots: u64, h: HostArgs) -> Res<HostParts> {
    let (host_slots, write_policy, write_threshold, load_back_min, host_policy, copier, kv) = h;
    let bad = |m: String| Err(fail(INVALID_ARGUMENT, m));
    let host_policy: Option<EvictionPolicy> = match host_policy.as_deref().map(str::parse) {
        None => None,
        Some(Ok(p)) => Some(p),
        Some(Err(e)) => return bad(format!("host_policy: {e}")),
    };
    let write_policy = WritePolicy::parse(&write_policy).map_err(st)?;
    if pool_slots == 0 {
        return bad(
            "pool_slots = 0: a host tier needs the device pool (pool_slots > 0, a multiple of \
             page_size)"
                .into(),
        );
    }
    if host_slots > 1 << 32 {
        return bad(format!("host_slots = {host_slots} is above 2^32"));
    }
    let copier_arc: Arc<dyn TierCopier>;
    let mut host_copier = None;
    match (copier.as_str(), kv) {
        ("none", None) => copier_arc = Arc::new(NullCopier::default()),
        ("none", Some(_)) => {
            return bad("kv_layout is for copier \"host\" (copier \"none\" has no bytes)".into());
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
            // host_slots = 0 is refused by the tier, with its own message.
            let host = store(host_slots.max(1), "host")?;
            let c = Arc::new(HostCopier::new(dev, host));
            host_copier = Some(c.clone());
            copier_arc = c;
        }
        (c, _) => return bad(format!("copier must be \"none\" or \"host\", got {c:?}")),
    }
    let tier = TierOptions {
        host_slots: host_slots as usize,
        write_policy,
        write_threshold,
        load_back_min: usize::try_from(load_back_min).unwrap_or(usize::MAX),
        host_policy,
    };
    Ok((tier, copier_arc, host_copier))
}

fn no_kv() -> Fail {
    fail(
        INVALID_ARGUMENT,
        "this cache has no KV bytes: make it with host=HostOptions(..., copier=\"host\", \
         kv_layout=...)",
    )
}

/// What a finished load-back hands Python: `(handle, lock length, slots, device_len,
/// loaded, outcome)`.
type LoadedRow<'py> = (u64, usize, Bound<'py, PyAny>, usize, usize, &'static str);

fn outcome_name(o: LoadOutcome) -> &'static str {
    match o {
        LoadOutcome::Loaded => "loaded",
        LoadOutcome::NothingOnHost => "nothing_on_host",
        LoadOutcome::TooShort => "too_short",
    }
}

/// The host tier's calls on one `NativeCache` (see the module docs).
#[pyclass(frozen, module = "radixkv._radixkv")]
pub struct NativeTier {
    cache: Py<NativeCache>,
}

impl NativeTier {
    fn c(&self) -> &NativeCache {
        self.cache.get()
    }

    /// Runs `f` on the cache with the GIL released; `function` names the Python method in
    /// an error's message.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        function: &str,
        f: impl FnOnce(&Cache) -> Res<T> + Send,
    ) -> PyResult<T> {
        self.c().inner.with(py, function, f)
    }

    fn store(&self, side: &str) -> Res<&Arc<HostKvStorage>> {
        let c = self.c().host_copier.as_ref().ok_or_else(no_kv)?;
        match side {
            "device" => Ok(c.device()),
            "host" => Ok(c.host()),
            s => Err(fail(
                INVALID_ARGUMENT,
                format!("side must be \"device\" or \"host\", got {s:?}"),
            )),
        }
    }

    /// A finished load-back as a row, its lock put in the cache's handle table.
    fn loaded_row<'py>(&self, py: Python<'py>, l: Loaded) -> PyResult<LoadedRow<'py>> {
        let n = l.lock.len();
        let h = self.c().locks.insert(l.lock);
        Ok((h, n, slot_buffer(py, &l.slots)?, l.device_len, l.loaded, outcome_name(l.outcome)))
    }
}

#[pymethods]
impl NativeTier {
    /// The tier calls of `cache` (a cache without a tier answers them as the core does).
    #[new]
    fn new(cache: Py<NativeCache>) -> Self {
        NativeTier { cache }
    }

    /// Whether the cache was built with host options.
    #[getter]
    fn has_tier(&self, py: Python<'_>) -> PyResult<bool> {
        self.with(py, "Cache.has_tier", |c| Ok(c.has_tier()))
    }

    /// The write policy's SGLang name, or None without a tier.
    #[getter]
    fn write_policy(&self, py: Python<'_>) -> PyResult<Option<&'static str>> {
        self.with(py, "Cache.host", |c| Ok(c.tier_options().map(|t| t.write_policy.name())))
    }

    // -- matching --

    /// `(device_len, host_len, slots)`: the device prefix (not pinned) and how far host
    /// copies extend it (0 without a tier).
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        ns: u64,
        tokens: &Bound<'py, PyAny>,
    ) -> PyResult<(usize, usize, Bound<'py, PyAny>)> {
        let t = tokens_of(tokens)?;
        let tv = t.view();
        let (m, out) = self.with(py, "Cache.lookup", |c| {
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
    fn lookup_lock<'py>(
        &self,
        py: Python<'py>,
        ns: u64,
        tokens: &Bound<'py, PyAny>,
    ) -> PyResult<(u64, usize, usize, Bound<'py, PyAny>)> {
        let t = tokens_of(tokens)?;
        let tv = t.view();
        let (h, m, out) = self.with(py, "Cache.lookup_lock", |c| {
            let mut sc = Vec::new();
            let toks = tv.get("tokens", &mut sc).map_err(oor)?;
            let mut out = Vec::with_capacity(toks.len());
            let (lock, m) = c.lookup_and_lock(ns, toks, &mut out);
            Ok((self.c().locks.insert(lock.into_raw()), m, out))
        })?;
        drop(t);
        Ok((h, m.device_len, m.host_len, slot_buffer(py, &out)?))
    }

    // -- eviction --

    /// Evicts at least `n` host tokens (host-only leaves): the host tokens freed.
    fn evict_host(&self, py: Python<'_>, n: u64) -> PyResult<usize> {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        self.with(py, "Cache.evict_host", |c| c.evict_host(n).map_err(st))
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
        self.with(py, "Cache.load_back", |c| {
            let mut sc = Vec::new();
            let toks = tv.get("tokens", &mut sc).map_err(oor)?;
            let pool = c.options().pool_slots;
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
            self.with(py, "Cache.wait_load", |c| c.wait_load(LoadTicket(ticket)).map_err(st))?;
        self.loaded_row(py, l)
    }

    /// The load-back's result if it is done (taking it), else None.
    fn try_load<'py>(&self, py: Python<'py>, ticket: u64) -> PyResult<Option<LoadedRow<'py>>> {
        let r = self.with(py, "Cache.try_load", |c| match c.try_load(LoadTicket(ticket)) {
            None => Ok(None),
            Some(r) => r.map(Some).map_err(st),
        })?;
        r.map(|l| self.loaded_row(py, l)).transpose()
    }

    /// Finishes the copies that are done: how many (0 without a tier).
    fn poll(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, "Cache.poll", |c| Ok(c.poll()))
    }

    /// Waits for every copy in flight (nothing to do without a tier).
    fn wait_all(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, "Cache.wait_all", |c| {
            c.wait_all();
            Ok(())
        })
    }

    // -- stats --

    /// The tier's counts and counters as a dict (the device cache's under `"device"`, as
    /// `NativeCache.stats`'s tuple); `NoTier` without a tier.
    fn tier_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (s, ns) = self.with(py, "Cache.tier_stats", |c| {
            let s = c.tier_stats().ok_or_else(|| st(radixkv::Error::NoTier))?;
            Ok((s, c.tree().namespace_count()))
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
    /// else what is wrong; `NoTier` without a tier.
    fn check_tier(&self, py: Python<'_>) -> PyResult<Option<String>> {
        self.with(py, "Cache.check_tier", |c| match c.check_tier() {
            None => Err(st(radixkv::Error::NoTier)),
            Some(Err(e)) => Ok(Some(e)),
            Some(Ok(())) => Ok(c.tree().check_invariants().err().map(|e| e.to_string())),
        })
    }

    // -- KV bytes (copier "host") --

    /// `(num_layers, num_kv_heads, head_dim, elem_bytes, slot_bytes)`, or None without
    /// KV bytes.
    fn kv_layout(&self) -> Option<(usize, usize, usize, usize, usize)> {
        let l = *self.c().host_copier.as_ref()?.device().layout();
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
        done(py, "Cache.kv_pointers", r)
    }

    /// Slot `slot`'s K and V bytes at layer `layer` of the `side` store.
    fn read_slot<'py>(
        &self,
        py: Python<'py>,
        side: &str,
        layer: usize,
        slot: u32,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        let s = done(py, "Cache.read_slot", self.store(side))?.clone();
        self.c().inner.refuse_if_closing(py, "Cache.read_slot")?;
        let n = s.layout().slot_bytes();
        let r = py.detach(|| {
            let (mut k, mut v) = (vec![0u8; n], vec![0u8; n]);
            s.read_slot(layer, slot, &mut k, &mut v).map(|()| (k, v)).map_err(st)
        });
        let (k, v) = done(py, "Cache.read_slot", r)?;
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
        let s = done(py, "Cache.write_slot", self.store(side))?.clone();
        self.c().inner.refuse_if_closing(py, "Cache.write_slot")?;
        let r = py.detach(|| s.write_slot(layer, slot, &k, &v).map_err(st));
        done(py, "Cache.write_slot", r)
    }
}
