//! Eviction and the built-in slot pool: evict (slots or runs), alloc and free (slots or
//! runs).

use std::cell::Cell;
use std::ffi::c_void;

use radixkv_core::cache::Cache;
use radixkv_core::slot_run::SlotRun;

use crate::args::{cache_ref, check_out, check_out_array, input, input_runs, write_array};
use crate::boundary::no_pool;
use crate::boundary::{boundary, fail, st};
use crate::refusal::{alloc_refusal, more_than_pool, slot_refusal};
use crate::types::{rkv_cache, rkv_free_fn, rkv_free_runs_fn, rkv_slot_run, rkv_status};

// ---------------------------------------------------------------------------------------
// Eviction and the pool.

/// Evicts at least `n_tokens` tokens (fewer only if nothing more is evictable; pinned pages
/// are never evicted) and writes the count freed to `*out_evicted` (required; it may exceed
/// `n_tokens`, a whole leaf goes at once). `free_fn(ctx, slots, n)` receives every freed
/// slot exactly once, on this thread, before the call returns; the slots then belong to the
/// caller (caller-managed mode). In pool mode the slots go back to the pool and `free_fn`
/// may be NULL (if given, it is told about them but must not free them again). Without a
/// pool a NULL `free_fn` is `RKV_NULL_ARGUMENT`. `free_fn` must not call into the same
/// cache. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `free_fn` NULL or a function safe to call with `ctx` and a
/// slot array; `out_evicted` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_evict(
    cache: *const rkv_cache,
    n_tokens: usize,
    free_fn: rkv_free_fn,
    ctx: *mut c_void,
    out_evicted: *mut usize,
) -> rkv_status {
    let evict = |cache: &Cache| match free_fn {
        None => cache.evict(n_tokens, None),
        Some(f) => {
            let mut tell = |slots: &[u32]| {
                if !slots.is_empty() {
                    // SAFETY: the caller guarantees `f` may be called with `ctx` and an
                    // array; `slots` is a live slice for the duration of the call.
                    unsafe { f(ctx, slots.as_ptr(), slots.len()) }
                }
            };
            cache.evict(n_tokens, Some(&mut tell))
        }
    };
    // SAFETY: the caller's contract for `cache` and `out_evicted` is `evict_into`'s.
    unsafe { evict_into("rkv_evict", cache, out_evicted, "out_evicted", free_fn.is_some(), evict) }
}

/// The body `rkv_evict`, `rkv_evict_runs` and `rkv_drop_namespace` share, inside the panic
/// boundary: checks `cache` and `out_evicted` (the argument `out_name`), refuses a missing callback without a pool
/// (`RKV_NULL_ARGUMENT`), runs `evict`, and writes the count freed only on success.
///
/// # Safety
/// `cache` is NULL or live; `out_evicted` NULL or writable.
pub(crate) unsafe fn evict_into(
    function: &str,
    cache: *const rkv_cache,
    out_evicted: *mut usize,
    out_name: &str,
    has_callback: bool,
    evict: impl FnOnce(&Cache) -> radixkv_core::error::Result<usize>,
) -> rkv_status {
    boundary(function, || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out(out_evicted, out_name)?;
        if !has_callback && !c.cache.has_pool() {
            return Err(fail(
                rkv_status::RKV_NULL_ARGUMENT,
                "free_fn is NULL, but this cache has no pool (pool_slots = 0): the evicted \
                 slots go back to the caller, through free_fn",
            ));
        }
        let evicted = evict(&c.cache).map_err(st)?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_evicted.write(evicted) };
        Ok(())
    })
}

/// `rkv_evict` handing the freed slots over as runs of consecutive slots (an extension of
/// version 1): `free_fn(ctx, runs, n)` gets each evicted leaf's slots as `rkv_slot_run`s,
/// O(runs) per leaf instead of O(tokens) when slots come in runs (as pools hand them out).
/// Everything else as `rkv_evict`: `*out_evicted` (required) gets the count freed; in pool
/// mode the slots go back to the pool and `free_fn` may be NULL; without a pool a NULL
/// `free_fn` is `RKV_NULL_ARGUMENT`. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `free_fn` NULL or a function safe to call with `ctx` and a run
/// array; `out_evicted` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_evict_runs(
    cache: *const rkv_cache,
    n_tokens: usize,
    free_fn: rkv_free_runs_fn,
    ctx: *mut c_void,
    out_evicted: *mut usize,
) -> rkv_status {
    let evict = |cache: &Cache| match free_fn {
        None => cache.evict_runs(n_tokens, None),
        Some(f) => {
            let mut tell = |runs: &[SlotRun]| {
                if !runs.is_empty() {
                    // SAFETY: `rkv_slot_run` has `SlotRun`'s layout (asserted in `types.rs`), and
                    // the caller guarantees `f` may be called with `ctx` and an array;
                    // `runs` is a live slice for the duration of the call.
                    unsafe { f(ctx, runs.as_ptr().cast::<rkv_slot_run>(), runs.len()) }
                }
            };
            cache.evict_runs(n_tokens, Some(&mut tell))
        }
    };
    // SAFETY: the caller's contract for `cache` and `out_evicted` is `evict_into`'s.
    unsafe {
        evict_into("rkv_evict_runs", cache, out_evicted, "out_evicted", free_fn.is_some(), evict)
    }
}

/// Pool mode only (else `RKV_NO_POOL`): allocates `n_slots` slots into
/// `out_slots[0..n_slots]` (NULL allowed when `n_slots == 0`), all or nothing, evicting
/// when free slots are short; `RKV_OUT_OF_SLOTS` when even that cannot find them. With
/// page_size > 1, `n_slots` must be a multiple of page_size and slots come in whole pages.
/// The caller owns the slots until it inserts them (the cache adopts them) or frees them.
/// Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `out_slots` NULL or writable for `n_slots` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_alloc(
    cache: *const rkv_cache,
    n_slots: usize,
    out_slots: *mut u32,
) -> rkv_status {
    boundary("rkv_alloc", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        if n_slots > 0 && out_slots.is_null() {
            return Err(fail(
                rkv_status::RKV_NULL_ARGUMENT,
                format!("out_slots is NULL but n_slots = {n_slots} (NULL is allowed only with 0)"),
            ));
        }
        if !c.cache.has_pool() {
            return Err(no_pool());
        }
        let pool_slots = c.cache.options().pool_slots;
        if n_slots > pool_slots {
            // More than the whole pool: short whatever is evicted (and no buffer that
            // large can exist), so fail before touching anything.
            return Err(more_than_pool(n_slots, pool_slots));
        }
        check_out_array(out_slots, n_slots, "out_slots", "n_slots")?;
        // The pool hands slots out as runs: take them as runs (a few entries, in a vector
        // this thread keeps) and expand them once into the caller's buffer, instead of
        // growing a vector of `n_slots` and copying it.
        thread_local! {
            static RUNS: Cell<Vec<SlotRun>> = const { Cell::new(Vec::new()) };
        }
        let mut runs = RUNS.take();
        runs.clear();
        let got = c.cache.alloc_runs(n_slots, &mut runs).map_err(|e| alloc_refusal(e, c, n_slots));
        let given: usize = runs.iter().map(|r| r.len as usize).sum();
        let res = match got {
            Err(e) => Err(e),
            Ok(()) if given != n_slots => {
                // Not the contract of `Cache::alloc_runs`: give them back and report the bug.
                let _ = c.cache.free_runs(&runs);
                Err(fail(
                    rkv_status::RKV_INTERNAL_ERROR,
                    format!(
                        "internal error: {given} slots came back for n_slots = {n_slots} (a \
                         bug, please report it); they went back to the pool"
                    ),
                ))
            }
            Ok(()) => {
                let mut at = 0;
                for r in &runs {
                    // SAFETY: `out_slots` passed `check_out_array` with cap `n_slots`, and
                    // the runs add up to `n_slots`, so `at + r.len <= n_slots`.
                    let d = unsafe {
                        std::slice::from_raw_parts_mut(out_slots.add(at), r.len as usize)
                    };
                    for (x, k) in d.iter_mut().zip(0u32..) {
                        *x = r.start + k;
                    }
                    at += r.len as usize;
                }
                Ok(())
            }
        };
        RUNS.set(runs);
        res
    })
}

/// Pool mode only (else `RKV_NO_POOL`): returns `slots[0..n_slots]` (allocated and never
/// adopted) to the pool. A slot that is free already or held by the tree is
/// `RKV_DOUBLE_FREE`, a slot outside the pool `RKV_INVALID_ARGUMENT`; either refuses the
/// whole call and changes nothing. The array stays owned by the caller (NULL allowed when
/// `n_slots == 0`). Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `slots` NULL or readable for `n_slots` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_free(
    cache: *const rkv_cache,
    slots: *const u32,
    n_slots: usize,
) -> rkv_status {
    boundary("rkv_free", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller guarantees slots[0..n_slots] is readable (or NULL).
        let s = unsafe { input(slots, n_slots, "slots", "n_slots") }?;
        let Some(pool) = c.cache.pool() else { return Err(no_pool()) };
        c.cache.free(s).map_err(|e| slot_refusal(e, &("slots", s), Some(pool)))
    })
}

/// `rkv_alloc` handing the slots out as runs of consecutive slots (an extension of version
/// 1): `out_runs[0..*out_n_runs]` (`*out_n_runs` required), ascending within each run, their
/// lengths adding up to `n_slots`; O(runs) instead of O(slots). Pass them to
/// `rkv_insert_runs` or `rkv_free_runs`. A pool hands out long runs, so a few runs usually
/// suffice; `out_cap = n_slots / page_size` always does. With a smaller `out_cap` than the
/// allocation's runs, the slots go straight back to the pool, `*out_n_runs` gets the number
/// of runs that allocation came in (another may differ) and the call returns
/// `RKV_BUFFER_TOO_SMALL` (what was evicted to make room stays evicted). `out_runs` may be
/// NULL only when `out_cap == 0`. Pool mode only (`RKV_NO_POOL`); the other refusals as
/// `rkv_alloc`. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `out_runs` NULL or writable for `out_cap` runs; `out_n_runs`
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_alloc_runs(
    cache: *const rkv_cache,
    n_slots: usize,
    out_runs: *mut rkv_slot_run,
    out_cap: usize,
    out_n_runs: *mut usize,
) -> rkv_status {
    boundary("rkv_alloc_runs", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out_array(out_runs, out_cap, "out_runs", "out_cap")?;
        check_out(out_n_runs, "out_n_runs")?;
        if !c.cache.has_pool() {
            return Err(no_pool());
        }
        let pool_slots = c.cache.options().pool_slots;
        if n_slots > pool_slots {
            return Err(more_than_pool(n_slots, pool_slots));
        }
        let mut runs = Vec::new();
        c.cache.alloc_runs(n_slots, &mut runs).map_err(|e| alloc_refusal(e, c, n_slots))?;
        let got = runs.iter().map(|r| r.len as usize).sum::<usize>();
        if got != n_slots {
            // Not the contract of `Cache::alloc_runs`: give them back and report the bug.
            let _ = c.cache.free_runs(&runs);
            return Err(fail(
                rkv_status::RKV_INTERNAL_ERROR,
                format!(
                    "internal error: {got} slots came back for n_slots = {n_slots} (a bug, \
                     please report it); they went back to the pool"
                ),
            ));
        }
        if runs.len() > out_cap {
            c.cache.free_runs(&runs).map_err(|e| {
                let m = format!("internal error: giving back an allocation failed: {e} (a bug)");
                fail(rkv_status::RKV_INTERNAL_ERROR, m)
            })?;
            // SAFETY: passed `check_out`; writable by the caller's contract.
            unsafe { out_n_runs.write(runs.len()) };
            return Err(fail(
                rkv_status::RKV_BUFFER_TOO_SMALL,
                format!(
                    "out_cap = {out_cap} is smaller than the {} runs the {n_slots} slots came \
                     in (*out_n_runs = {}); the slots went back to the pool; out_cap = \
                     n_slots / page_size = {} always suffices",
                    runs.len(),
                    runs.len(),
                    n_slots / c.cache.page_size()
                ),
            ));
        }
        // SAFETY: `out_runs` passed `check_out_array` with `out_cap >= runs.len()` and has
        // `SlotRun`'s layout; `out_n_runs` passed `check_out`.
        unsafe {
            write_array(out_runs.cast::<SlotRun>(), &runs);
            out_n_runs.write(runs.len());
        }
        Ok(())
    })
}

/// `rkv_free` for slots given as runs (an extension of version 1): returns the slots of
/// `runs[0..n_runs]` (allocated and never adopted) to the pool, refused whole as `rkv_free`
/// is (an empty run is `RKV_INVALID_ARGUMENT`). The array stays owned by the caller (NULL
/// allowed when `n_runs == 0`). Pool mode only (`RKV_NO_POOL`). Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `runs` NULL or readable for `n_runs` runs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_free_runs(
    cache: *const rkv_cache,
    runs: *const rkv_slot_run,
    n_runs: usize,
) -> rkv_status {
    boundary("rkv_free_runs", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller guarantees runs[0..n_runs] is readable (or NULL).
        let r = unsafe { input_runs(runs, n_runs, "runs", "n_runs") }?;
        let Some(pool) = c.cache.pool() else { return Err(no_pool()) };
        c.cache.free_runs(r).map_err(|e| {
            if let Some((i, x)) = r.iter().enumerate().find(|(_, x)| x.len == 0) {
                let m = format!("runs[{i}] = {{start {}, len 0}} is empty", x.start);
                return fail(rkv_status::RKV_INVALID_ARGUMENT, m);
            }
            slot_refusal(e, &("runs", r), Some(pool))
        })
    })
}
