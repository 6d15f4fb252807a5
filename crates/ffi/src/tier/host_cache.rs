//! A plain `rkv_cache` with a host tier (an extension of version 1): created by
//! `rkv_cache_new_host` from the same `rkv_tier_options` as `rkv_tier_new`, it is one cache
//! whose plain calls go through the tier (the core's [`radixkv_core::Cache::with_host`]):
//! `rkv_insert*` back pages up by the write policy, `rkv_evict*` and `rkv_alloc*`'s
//! evictions keep host copies (`RKV_WRITE_BACK` copies first), `rkv_match*` finish the
//! copies that are done first, and `rkv_cache_free` waits for every copy in flight. The
//! tier's counters and its own progress calls are `rkv_cache_tier_stats` and
//! `rkv_cache_wait_all`; load-back stays `rkv_tier_*`'s (an `rkv_tier` is the same core
//! cache behind its own handle).

use super::*;

use crate::args::cache_ref;
use crate::rkv_cache;

/// `rkv_cache_new_with` with a host tier (an extension of version 1): a cache from `*opts`
/// (required; it must have a pool: `pool_slots > 0`) and `*policy` (NULL: the defaults),
/// with a host tier from `*tier_opts` (required, checked as `rkv_tier_new` checks it); all
/// three are read only during the call. Writes the cache to `*out_cache` (required); the
/// caller owns it and frees it with `rkv_cache_free`, which first waits for every copy in
/// flight (a callback copier is called then, so it must still be valid). Its plain calls
/// go through the tier (see `rkv_tier_new` for the semantics): an insert's slots must then
/// be whole pool pages, as `rkv_alloc` hands them out. `RKV_COPIER_HOST`'s stores are
/// allocated as for `rkv_tier_new`, but only an `rkv_tier` exposes their addresses. Fails
/// as `rkv_cache_new_with` and `rkv_tier_new` do, creating nothing. Thread-safe.
///
/// # Safety
/// `opts` NULL or a readable `rkv_options`; `policy` NULL or a readable
/// `rkv_policy_options`; `tier_opts` NULL or a readable `rkv_tier_options`; `out_cache`
/// NULL or a writable `rkv_cache *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_new_host(
    opts: *const rkv_options,
    policy: *const crate::rkv_policy_options,
    tier_opts: *const rkv_tier_options,
    out_cache: *mut *mut rkv_cache,
) -> rkv_status {
    boundary("rkv_cache_new_host", || {
        if opts.is_null() {
            return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "opts is NULL"));
        }
        if tier_opts.is_null() {
            return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "tier_opts is NULL"));
        }
        check_out(out_cache, "out_cache")?;
        check_opt_in(tier_opts, "tier_opts")?;
        // SAFETY: the caller passes a readable `rkv_options` and NULL or a readable policy.
        let dev = unsafe { cache_options(opts, policy) }?;
        // SAFETY: non-null and aligned (checked above); readable by the caller's contract.
        let o = unsafe { read_sized(tier_opts, "tier_opts", "rkv_tier_options") }?;
        let topts = life::tier_options(&o, &dev)?;
        let (copier, _stores) = life::copier_of(&o, dev.pool_slots, topts.host_slots)?;
        let cache = Cache::with_host(dev, topts, copier)
            .map_err(|e| fail(rkv_status::from(&e), format!("tier_opts: {e}")))?;
        let locks = LockTable::new().ok_or_else(|| {
            fail(
                rkv_status::RKV_INTERNAL_ERROR,
                "too many live caches and tiers: 2^20 - 1 exist in this process (free some)",
            )
        })?;
        let raw = Box::into_raw(Box::new(rkv_cache { cache, locks }));
        // SAFETY: `out_cache` passed `check_out` and is writable by the caller's contract.
        unsafe { out_cache.write(raw) };
        Ok(())
    })
}

/// Writes the host tier's counts and counters of a cache made by `rkv_cache_new_host` to
/// `*out_stats` (required, owned by the caller), as `rkv_tier_get_stats` does for a tier.
/// `RKV_INVALID_ARGUMENT` for a cache without a host tier. An extension of version 1.
/// Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `out_stats` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_tier_stats(
    cache: *const rkv_cache,
    out_stats: *mut rkv_tier_stats,
) -> rkv_status {
    boundary("rkv_cache_tier_stats", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out(out_stats, "out_stats")?;
        let s = c.cache.tier_stats().ok_or_else(|| {
            bad("this cache has no host tier (create it with rkv_cache_new_host)".into())
        })?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_stats.write(stats::c_tier_stats(&s)) };
        Ok(())
    })
}

/// Waits for every host tier copy in flight of a cache made by `rkv_cache_new_host` and
/// finishes it (as `rkv_tier_wait_all`); `RKV_OK` and nothing to do for a cache without a
/// host tier. An extension of version 1. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_wait_all(cache: *const rkv_cache) -> rkv_status {
    boundary("rkv_cache_wait_all", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        c.cache.wait_all();
        Ok(())
    })
}
