//! A cache's life: option defaults, eviction policies by number and name, create, free,
//! statistics, reset and reclaim.

use std::ffi::{CStr, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use radixkv_core::cache::{Cache, CacheOptions, CacheStats, FreeFn};
use radixkv_core::error::Error;
use radixkv_core::tree::EvictionPolicy;

use crate::args::{cache_mut, cache_ref, check_opt_in, check_out, read_sized};
use crate::boundary::{Res, boundary, fail, st};
use crate::handles::LockTable;
use crate::types::*;

// ---------------------------------------------------------------------------------------
// Lifecycle.

/// Default options: page_size 1, `RKV_EVICT_LRU`, pool_slots 0 (caller-managed slots).
/// Returns a plain value. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_options_default() -> rkv_options {
    rkv_options {
        page_size: 1,
        eviction_policy: rkv_eviction_policy::RKV_EVICT_LRU as u32,
        pool_slots: 0,
    }
}

/// Default policy parameters (an extension of version 1): `size =
/// sizeof(rkv_policy_options)`, `slru_threshold = RKV_DEFAULT_SLRU_THRESHOLD`. Returns a
/// plain value. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_policy_options_default() -> rkv_policy_options {
    rkv_policy_options {
        size: size_of::<rkv_policy_options>() as u32,
        slru_threshold: RKV_DEFAULT_SLRU_THRESHOLD,
        swa_window: 0,
    }
}

/// Default insert options (an extension of version 1): `size =
/// sizeof(rkv_insert_options)`, priority 0, inserted_len 0 (what `rkv_insert` uses).
/// Returns a plain value. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_insert_options_default() -> rkv_insert_options {
    rkv_insert_options {
        size: size_of::<rkv_insert_options>() as u32,
        reserved: 0,
        priority: 0,
        inserted_len: 0,
    }
}

/// Default match options (an extension of version 1): `size = sizeof(rkv_match_options)`,
/// flags 0 (a plain match, as `rkv_match`). Returns a plain value. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_match_options_default() -> rkv_match_options {
    rkv_match_options { size: size_of::<rkv_match_options>() as u32, flags: 0 }
}

/// The `rkv_eviction_policy` number of a policy.
pub(crate) fn c_policy(p: EvictionPolicy) -> rkv_eviction_policy {
    use rkv_eviction_policy::*;
    match p {
        EvictionPolicy::Lru => RKV_EVICT_LRU,
        EvictionPolicy::Fifo => RKV_EVICT_FIFO,
        EvictionPolicy::Lfu => RKV_EVICT_LFU,
        EvictionPolicy::Mru => RKV_EVICT_MRU,
        EvictionPolicy::Filo => RKV_EVICT_FILO,
        EvictionPolicy::Priority => RKV_EVICT_PRIORITY,
        EvictionPolicy::Slru => RKV_EVICT_SLRU,
    }
}

/// The policy numbered `n`, if one is.
pub(crate) fn policy_of(n: u32) -> Option<EvictionPolicy> {
    EvictionPolicy::ALL.into_iter().find(|&p| c_policy(p) as u32 == n)
}

/// The valid numbers with their names, in number order: "0 = RKV_EVICT_LRU, 1 = ...".
pub(crate) fn valid_policies() -> String {
    let mut all: Vec<rkv_eviction_policy> = EvictionPolicy::ALL.map(c_policy).into();
    all.sort_by_key(|&p| p as u32);
    all.iter().map(|&p| format!("{} = {p:?}", p as u32)).collect::<Vec<_>>().join(", ")
}

/// A policy's name (`EvictionPolicy::name`) as a static C string.
pub(crate) fn policy_cname(p: EvictionPolicy) -> &'static CStr {
    match p {
        EvictionPolicy::Lru => c"lru",
        EvictionPolicy::Fifo => c"fifo",
        EvictionPolicy::Lfu => c"lfu",
        EvictionPolicy::Mru => c"mru",
        EvictionPolicy::Filo => c"filo",
        EvictionPolicy::Priority => c"priority",
        EvictionPolicy::Slru => c"slru",
    }
}

/// The name of eviction policy number `policy` as SGLang's `--radix-eviction-policy`
/// spells it ("lru", "fifo", "lfu", "mru", "filo", "priority", "slru"), a static
/// NUL-terminated string the caller must not free; NULL for a number that is not an
/// `rkv_eviction_policy`. An extension of version 1. Thread-safe; leaves
/// `rkv_last_error_message()` as it is.
#[unsafe(no_mangle)]
pub extern "C" fn rkv_eviction_policy_name(policy: u32) -> *const c_char {
    policy_of(policy).map_or(std::ptr::null(), |p| policy_cname(p).as_ptr())
}

/// Reads an eviction policy's name (`name`, required, NUL-terminated, as
/// `rkv_eviction_policy_name` gives it; ASCII case ignored) and writes its
/// `rkv_eviction_policy` number to `*out_policy` (required), for an engine that takes
/// SGLang's `--radix-eviction-policy`. An unknown name is `RKV_INVALID_ARGUMENT`, with a
/// message listing the valid ones. An extension of version 1. Thread-safe.
///
/// # Safety
/// `name` is NULL or a readable NUL-terminated string; `out_policy` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_eviction_policy_from_name(
    name: *const c_char,
    out_policy: *mut u32,
) -> rkv_status {
    boundary("rkv_eviction_policy_from_name", || {
        if name.is_null() {
            return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "name is NULL"));
        }
        check_out(out_policy, "out_policy")?;
        // SAFETY: non-null; the caller guarantees a readable NUL-terminated string, which
        // is only read during the call.
        let text = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let policy = text.parse::<EvictionPolicy>().map_err(|e| match e {
            Error::InvalidArgument(m) => fail(
                rkv_status::RKV_INVALID_ARGUMENT,
                format!("name: {m}; as numbers: {}", valid_policies()),
            ),
            e => st(e),
        })?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_policy.write(c_policy(policy) as u32) };
        Ok(())
    })
}

/// Creates a cache from `*opts` (required; read only during the call) and writes it to
/// `*out_cache` (required). The caller owns the new cache and frees it with
/// `rkv_cache_free`. `RKV_INVALID_ARGUMENT` for page_size 0, an unknown eviction_policy, or
/// a pool size that is not a multiple of page_size or above 2^32. The policy's parameters
/// are the defaults (`rkv_cache_new_with` sets them). Thread-safe.
///
/// # Safety
/// `opts` is NULL or points to a readable `rkv_options`; `out_cache` is NULL or points to
/// a writable `rkv_cache *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_new(
    opts: *const rkv_options,
    out_cache: *mut *mut rkv_cache,
) -> rkv_status {
    // SAFETY: the caller's contract for `opts` and `out_cache` is `new_cache`'s, and a NULL
    // `policy` is allowed.
    boundary("rkv_cache_new", || unsafe { new_cache(opts, std::ptr::null(), out_cache) })
}

/// `rkv_cache_new` with the eviction policy's parameters (an extension of version 1):
/// `*policy` (read only during the call) sets them, e.g. `RKV_EVICT_SLRU`'s
/// `slru_threshold`; NULL means `rkv_policy_options_default()`, so
/// `rkv_cache_new_with(opts, NULL, out)` is `rkv_cache_new(opts, out)`. The policy itself
/// stays `opts->eviction_policy`. Parameters of a policy other than the cache's are
/// accepted and ignored. `RKV_INVALID_ARGUMENT` also for `policy->size` other than
/// `sizeof(rkv_policy_options)`. Thread-safe.
///
/// # Safety
/// As `rkv_cache_new`; `policy` is NULL or points to a readable `rkv_policy_options`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_new_with(
    opts: *const rkv_options,
    policy: *const rkv_policy_options,
    out_cache: *mut *mut rkv_cache,
) -> rkv_status {
    // SAFETY: the caller's contract for the three pointers is `new_cache`'s.
    boundary("rkv_cache_new_with", || unsafe { new_cache(opts, policy, out_cache) })
}

/// The core's options for `*opts` and `*policy` (NULL: the defaults), as `rkv_cache_new_with`
/// checks them (`rkv_tier_new` too).
///
/// # Safety
/// `opts` is NULL or readable; `policy` NULL or readable.
pub(crate) unsafe fn cache_options(
    opts: *const rkv_options,
    policy: *const rkv_policy_options,
) -> Res<CacheOptions> {
    if opts.is_null() {
        return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "opts is NULL"));
    }
    if !opts.is_aligned() {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!("opts = {opts:p} is not aligned to {} bytes", align_of::<rkv_options>()),
        ));
    }
    check_opt_in(policy, "policy")?;
    // SAFETY: non-null and aligned; the caller guarantees it points to a readable
    // `rkv_options` (a plain-old-data struct: every bit pattern is valid).
    let o = unsafe { opts.read() };
    let bad = |m: String| Err(fail(rkv_status::RKV_INVALID_ARGUMENT, m));
    let Some(eviction) = policy_of(o.eviction_policy) else {
        return bad(format!(
            "opts->eviction_policy = {} is not an rkv_eviction_policy ({})",
            o.eviction_policy,
            valid_policies()
        ));
    };
    if o.page_size == 0 {
        return bad("opts->page_size = 0: the page size must be at least 1".into());
    }
    if o.pool_slots > 1 << 32 {
        return bad(format!(
            "opts->pool_slots = {} is above 2^32 = 4294967296 (slot ids are uint32_t)",
            o.pool_slots
        ));
    }
    if o.pool_slots % u64::from(o.page_size) != 0 {
        return bad(format!(
            "opts->pool_slots = {} is not a multiple of opts->page_size = {} (the pool holds \
             whole pages)",
            o.pool_slots, o.page_size
        ));
    }
    let Ok(pool_slots) = usize::try_from(o.pool_slots) else {
        return bad(format!(
            "opts->pool_slots = {} does not fit this platform's size_t",
            o.pool_slots
        ));
    };
    let params = if policy.is_null() {
        rkv_policy_options_default()
    } else {
        // SAFETY: non-null and aligned (`check_opt_in`); readable by the caller's contract.
        unsafe { read_policy_options(policy) }?
    };
    Ok(CacheOptions {
        page_size: o.page_size as usize,
        policy: eviction,
        pool_slots,
        slru_threshold: params.slru_threshold,
        swa_window: params.swa_window as usize,
    })
}

/// Reads an `rkv_policy_options` of this header's size, or of the size before
/// `swa_window` was appended (8: that field then keeps its default, 0).
///
/// # Safety
/// `p` is non-null, aligned, and points to a readable `rkv_policy_options` of at least the
/// size its first field states, when that size is one of the two accepted here.
unsafe fn read_policy_options(p: *const rkv_policy_options) -> Res<rkv_policy_options> {
    // SAFETY: the first field is a `u32` at offset 0, readable by the caller's contract.
    let size = unsafe { p.cast::<u32>().read() };
    if size == 8 {
        // SAFETY: the caller's struct is the 8-byte one: `slru_threshold`, its second `u32`
        // (offset 4, as `repr(C)` lays it out in both sizes), is readable.
        let slru_threshold = unsafe { p.cast::<u32>().add(1).read() };
        return Ok(rkv_policy_options { slru_threshold, ..rkv_policy_options_default() });
    }
    if size as usize != size_of::<rkv_policy_options>() {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!(
                "policy->size = {size} is not the size of an rkv_policy_options this library \
                 knows ({}, or 8 from before swa_window): start from \
                 rkv_policy_options_default(), which sets it",
                size_of::<rkv_policy_options>()
            ),
        ));
    }
    // SAFETY: as this function's contract.
    unsafe { read_sized(p, "policy", "rkv_policy_options") }
}

/// The body of `rkv_cache_new` and `rkv_cache_new_with`, inside their panic boundary.
///
/// # Safety
/// `opts` is NULL or readable; `policy` NULL or readable; `out_cache` NULL or writable.
pub(crate) unsafe fn new_cache(
    opts: *const rkv_options,
    policy: *const rkv_policy_options,
    out_cache: *mut *mut rkv_cache,
) -> Res<()> {
    if opts.is_null() {
        return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "opts is NULL"));
    }
    check_out(out_cache, "out_cache")?;
    // SAFETY: the caller's contract for `opts` and `policy` is `cache_options`'.
    let copts = unsafe { cache_options(opts, policy) }?;
    let cache = Cache::new(copts).map_err(|e| fail(rkv_status::from(&e), format!("opts: {e}")))?;
    // `None` only with 2^20 - 1 caches live at once (see `handles`).
    let locks = LockTable::new().ok_or_else(|| {
        fail(
            rkv_status::RKV_INTERNAL_ERROR,
            "too many live caches: 2^20 - 1 = 1048575 exist in this process, the most there \
             can be (free some)",
        )
    })?;
    let raw = Box::into_raw(Box::new(rkv_cache {
        cache,
        locks,
        loads: Default::default(),
        requests: Default::default(),
    }));
    // SAFETY: `out_cache` passed `check_out` (non-null, aligned) and the caller guarantees
    // it is writable.
    unsafe { out_cache.write(raw) };
    Ok(())
}

/// Writes the cache's eviction policy (its `rkv_eviction_policy` number) to `*out_policy`
/// and its SLRU threshold to `*out_slru_threshold` (both required; the threshold is
/// written whatever the policy, the default unless `rkv_cache_new_with` set it). An
/// extension of version 1. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `out_policy` and `out_slru_threshold` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_eviction_policy(
    cache: *const rkv_cache,
    out_policy: *mut u32,
    out_slru_threshold: *mut u32,
) -> rkv_status {
    boundary("rkv_cache_eviction_policy", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out(out_policy, "out_policy")?;
        check_out(out_slru_threshold, "out_slru_threshold")?;
        let o = c.cache.options();
        // SAFETY: both passed `check_out`; writable by the caller's contract.
        unsafe {
            out_policy.write(c_policy(o.policy) as u32);
            out_slru_threshold.write(o.slru_threshold);
        }
        Ok(())
    })
}

/// Destroys a cache: aborts its live requests (`rkv_request_admit`: their slots go back to
/// the pool and their pins are released; each handle is then refused by every request call
/// with `RKV_INVALID_ARGUMENT` and stays the caller's to free with `rkv_request_abort`),
/// releases its outstanding locks (their handles become invalid) and frees everything it
/// owns. Slots it held are not reported (in caller-managed mode, evict
/// first with a callback if you need them back). NULL is a no-op. Must not run concurrently
/// with any other call on the same cache, and the cache must not be used afterwards: any
/// call with a freed cache, `rkv_release` of one of its locks included, is undefined
/// behavior (it reads freed memory; it may block forever or corrupt the heap). Leaves
/// `rkv_last_error_message()` as it is.
///
/// # Safety
/// `cache` is NULL or was returned by `rkv_cache_new` and not freed yet, and no other call
/// on it runs concurrently or follows.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_free(cache: *mut rkv_cache) {
    if cache.is_null() || !cache.is_aligned() {
        return;
    }
    // SAFETY: `cache` came from `Box::into_raw` in `rkv_cache_new` and, by the caller's
    // contract, is freed once and used by no one else now, so we own it again.
    let mut owned = unsafe { Box::from_raw(cache) };
    // A panic here would abort at the boundary; contain it. The cache is dropped either way
    // (on a panic, during unwinding).
    let _ = catch_unwind(AssertUnwindSafe(move || {
        // A host tier's copies in flight first, then the load-backs never taken (nothing
        // to do without a tier).
        owned.cache.wait_all();
        owned.loads.finish(&owned.cache);
        // The live requests: aborted (their slots back in the pool, their pins released);
        // their handles stay the caller's to free with `rkv_request_abort`.
        owned.requests.abort_all(&owned.cache);
        for lock in owned.locks.drain() {
            let _ = owned.cache.release(lock);
        }
        drop(owned);
    }));
}

// ---------------------------------------------------------------------------------------
// Stats and reset.

pub(crate) fn to_c_stats(s: &CacheStats) -> rkv_stats {
    rkv_stats {
        cached_tokens: s.tree.cached_tokens,
        evictable_tokens: s.tree.evictable_tokens,
        protected_tokens: s.tree.protected_tokens,
        nodes: s.tree.nodes,
        pool_slots: s.pool_slots,
        free_slots: s.free_slots,
        match_calls: s.tree.match_calls,
        match_query_tokens: s.tree.match_query_tokens,
        match_hit_tokens: s.tree.match_hit_tokens,
        inserted_tokens: s.tree.inserted_tokens,
        evicted_tokens: s.tree.evicted_tokens,
    }
}

/// Writes the cache's counts and counters to `*out_stats` (required, owned by the caller).
/// Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `out_stats` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_stats(
    cache: *const rkv_cache,
    out_stats: *mut rkv_stats,
) -> rkv_status {
    boundary("rkv_cache_stats", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out(out_stats, "out_stats")?;
        let s = to_c_stats(&c.cache.stats());
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_stats.write(s) };
        Ok(())
    })
}

/// Drops every unpinned page (all of them when nothing is pinned); locks stay valid and
/// their pages stay cached. In pool mode the slots go back to the pool. In caller-managed
/// mode the dropped slots are not reported: to get them back, call
/// `rkv_evict(cache, SIZE_MAX, free_fn, ctx, &n)` instead, which drops the same pages.
/// Thread-safe.
///
/// # Safety
/// `cache` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_reset(cache: *const rkv_cache) -> rkv_status {
    boundary("rkv_cache_reset", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        if c.cache.has_pool() {
            c.cache.reset(None).map_err(st)
        } else {
            c.cache.reset(Some(&mut |_: &[u32]| {})).map_err(st)
        }
    })
}

/// Empties the cache holding it exclusively (an extension of version 1): drops every
/// unpinned page, as `rkv_cache_reset` does, and with events on (`rkv_events_enable`)
/// publishes one `RKV_EVENT_ALL_BLOCKS_CLEARED` when that leaves the cache empty (nothing
/// was pinned; an empty cache publishes nothing), or the `RKV_EVENT_BLOCK_REMOVED` of every
/// page it dropped when locks keep some pages cached. Locks stay valid and their pages stay
/// cached. `free_fn(ctx, slots, n)`, if not NULL, receives every dropped slot exactly once,
/// on this thread, before the call returns: in caller-managed mode the slots then belong to
/// the caller (with NULL they are not reported, as with `rkv_cache_reset`); in pool mode
/// they go back to the pool either way (`free_fn` is told and must not free them again).
/// `free_fn` must return normally and must not call into the same cache. `ctx` is passed to
/// it as is. Changes nothing on an error (`RKV_NULL_ARGUMENT` for a NULL cache).
///
/// Not thread-safe: it must not run concurrently with any other call on the same cache
/// (like `rkv_cache_free`), which is why it takes a non-const `rkv_cache *`; holding the
/// cache alone is what makes `RKV_EVENT_ALL_BLOCKS_CLEARED` mean "empty" to a subscriber (no
/// insert lands between the last drop and the event). Under concurrent calls use
/// `rkv_cache_reset`, which publishes the removals instead.
///
/// # Safety
/// `cache` is NULL or live, and no other call on it runs concurrently; `free_fn` NULL or a
/// function safe to call with `ctx` and a slot array.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_clear(
    cache: *mut rkv_cache,
    free_fn: rkv_free_fn,
    ctx: *mut c_void,
) -> rkv_status {
    boundary("rkv_cache_clear", || {
        // SAFETY: the caller passes NULL or a live cache that nothing else uses meanwhile.
        let c = unsafe { cache_mut(cache) }?;
        let mut tell = |slots: &[u32]| {
            if let (Some(f), false) = (free_fn, slots.is_empty()) {
                // SAFETY: the caller guarantees `f` may be called with `ctx` and an array;
                // `slots` is a live slice for the duration of the call.
                unsafe { f(ctx, slots.as_ptr(), slots.len()) }
            }
        };
        // Without a pool the core needs a callback to hand the slots to: `tell` (which
        // drops them when `free_fn` is NULL, as `rkv_cache_reset` does).
        let free: Option<FreeFn<'_>> =
            if free_fn.is_none() && c.cache.has_pool() { None } else { Some(&mut tell) };
        c.cache.clear(free).map_err(st)
    })
}

/// Frees memory the index unlinked earlier (split, evicted or replaced nodes and tables)
/// once no reader can hold it, a bounded batch per call. Never needed for correctness: the
/// same work otherwise runs inside whichever call next pins the thread (every 128th), which
/// then takes tens of microseconds longer. Call it where latency does not matter, e.g. once
/// per scheduler step after launching the batch. Thread-safe; an extension of ABI version 1.
///
/// # Safety
/// `cache` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_reclaim(cache: *const rkv_cache) -> rkv_status {
    boundary("rkv_reclaim", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        c.cache.reclaim();
        Ok(())
    })
}
