//! A plain `rkv_cache` with a host tier (an extension of version 1): created by
//! `rkv_cache_new_host` from the same `rkv_tier_options` as `rkv_tier_new`, it is one cache
//! whose plain calls go through the tier (the core's [`radixkv_core::Cache::with_host`]):
//! `rkv_insert*` back pages up by the write policy, `rkv_evict*` and `rkv_alloc*`'s
//! evictions keep host copies (`RKV_WRITE_BACK` copies first), `rkv_match*` finish the
//! copies that are done first, and `rkv_cache_free` waits for every copy in flight. The
//! tier's counters and its own progress calls are `rkv_cache_tier_stats` and
//! `rkv_cache_wait_all`; `rkv_match_ex` says how far host copies extend a match, and
//! `rkv_cache_load_back` / `rkv_cache_load_poll` / `rkv_cache_load_wait` bring them back,
//! `rkv_cache_evict_host` evicts host pages. They are `rkv_tier_*`'s calls (an `rkv_tier` is
//! the same core cache behind its own handle, and both go through one [`Door`]); on a cache
//! without a host tier each refuses with `RKV_INVALID_ARGUMENT` (the core's `NoTier`),
//! nothing changed.

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
/// as `rkv_cache_new_with` and `rkv_tier_new` do, creating nothing. Thread-safe. Its tier's
/// calls on the plain handle: `rkv_match_ex` (`host_len`), `rkv_cache_load_back` /
/// `_load_poll` / `_load_wait`, `rkv_cache_evict_host`, `rkv_cache_tier_stats`,
/// `rkv_cache_wait_all`.
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
        let raw = Box::into_raw(Box::new(rkv_cache {
            cache,
            locks,
            loads: Default::default(),
            requests: Default::default(),
        }));
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
        let s = c.cache.tier_stats().ok_or_else(no_tier)?;
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

/// The refusal of a host tier call on a cache made without one.
fn no_tier() -> crate::Fail {
    bad("this cache has no host tier (create it with rkv_cache_new_host)".into())
}

/// The cache behind `cache`, refused unless it has a host tier.
///
/// # Safety
/// `cache` is NULL or live.
unsafe fn host_cache_ref<'a>(cache: *const rkv_cache) -> Res<&'a rkv_cache> {
    // SAFETY: the caller passes NULL or a live cache that is not being freed.
    let c = unsafe { cache_ref(cache) }?;
    if !c.cache.has_tier() {
        return Err(no_tier());
    }
    Ok(c)
}

/// `rkv_tier_load_back` on a cache made by `rkv_cache_new_host` (an extension of version
/// 1): starts loading back the host pages that extend the device match of
/// `tokens[0..n_tokens]` in `ns` (what `rkv_match_ex` reports as `host_len`), at most
/// `max_tokens` of them (`SIZE_MAX`: all): allocates device slots (evicting as
/// `rkv_alloc`), pins the host copies and starts the copy. Writes a ticket to `*out_ticket`
/// (required, a plain value); take the result with `rkv_cache_load_poll` or
/// `rkv_cache_load_wait` exactly once (the result holds a lock of this cache, released with
/// `rkv_release`; `rkv_cache_free` waits for and releases results never taken). When
/// nothing is worth loading the ticket is done at once and its result says why
/// (`RKV_LOAD_NOTHING_ON_HOST`, `RKV_LOAD_TOO_SHORT`). `RKV_OUT_OF_SLOTS` (nothing changed,
/// no ticket) when the device cannot hold the pages; `RKV_DEVICE_ERROR` (everything rolled
/// back, no ticket) when the copier refuses to start the copy; `RKV_INVALID_ARGUMENT` for
/// a cache without a host tier. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `tokens` NULL or readable for `n_tokens` values; `out_ticket`
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_load_back(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    max_tokens: usize,
    out_ticket: *mut u64,
) -> rkv_status {
    boundary("rkv_cache_load_back", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { host_cache_ref(cache) }?;
        // SAFETY: the caller's contract is `load_back_in`'s.
        unsafe { load::load_back_in(c.door(), ns, tokens, n_tokens, max_tokens, out_ticket) }
    })
}

/// `rkv_tier_load_poll` on a cache made by `rkv_cache_new_host` (an extension of version
/// 1): whether load-back `ticket` is done, without blocking (finishing the copies that
/// are): `RKV_OK` with `*out_done = 0` while its copy runs (nothing else written), or with
/// `*out_done = 1` and the result: `*out_result` (its lock is the caller's, released with
/// `rkv_release`), the slots of the locked prefix in `out_slots[0..*out_len]`. If those do
/// not fit `out_cap`, `RKV_BUFFER_TOO_SMALL` with only `*out_len` written and the result
/// kept for the next call (`out_cap = n_tokens` of the load-back always suffices). A failed
/// copy is `RKV_DEVICE_ERROR`, everything rolled back and the ticket spent. An unknown or
/// taken ticket, or a cache without a host tier, is `RKV_INVALID_ARGUMENT`. All outputs
/// required (`out_slots` may be NULL when `out_cap == 0`) and owned by the caller.
/// Thread-safe (one caller takes a ticket's result).
///
/// # Safety
/// `cache` is NULL or live; `out_slots[0..out_cap]` writable (or NULL); the other outputs
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_load_poll(
    cache: *const rkv_cache,
    ticket: u64,
    out_slots: *mut u32,
    out_cap: usize,
    out_len: *mut usize,
    out_result: *mut rkv_load_result,
    out_done: *mut c_int,
) -> rkv_status {
    boundary("rkv_cache_load_poll", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { host_cache_ref(cache) }?;
        // SAFETY: the caller's contract is `take_load`'s.
        unsafe {
            load::take_load(
                c.door(),
                ticket,
                out_slots,
                out_cap,
                out_len,
                out_result,
                Some(out_done),
                |c, t| c.try_load(t),
            )
        }
    })
}

/// `rkv_cache_load_poll` that blocks until the load-back is done (no `out_done`), as
/// `rkv_tier_load_wait` (an extension of version 1): `RKV_OK` with the result,
/// `RKV_BUFFER_TOO_SMALL` (result kept), `RKV_DEVICE_ERROR` for a failed copy (rolled back,
/// ticket spent), `RKV_INVALID_ARGUMENT` for an unknown or taken ticket or a cache without
/// a host tier. Thread-safe.
///
/// # Safety
/// As `rkv_cache_load_poll`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_load_wait(
    cache: *const rkv_cache,
    ticket: u64,
    out_slots: *mut u32,
    out_cap: usize,
    out_len: *mut usize,
    out_result: *mut rkv_load_result,
) -> rkv_status {
    boundary("rkv_cache_load_wait", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { host_cache_ref(cache) }?;
        // SAFETY: the caller's contract is `take_load`'s.
        unsafe {
            load::take_load(
                c.door(),
                ticket,
                out_slots,
                out_cap,
                out_len,
                out_result,
                None,
                |c, t| Some(c.wait_load(t)),
            )
        }
    })
}

/// `rkv_tier_evict_host` on a cache made by `rkv_cache_new_host` (an extension of version
/// 1): evicts at least `n_tokens` host tokens (host-only leaves, by the host policy; never
/// a page being copied, pinned by a load-back, or still on the device) and writes the host
/// tokens freed to `*out_evicted` (required; fewer when nothing more is evictable).
/// `RKV_INVALID_ARGUMENT` for a cache without a host tier. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `out_evicted` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_evict_host(
    cache: *const rkv_cache,
    n_tokens: usize,
    out_evicted: *mut usize,
) -> rkv_status {
    boundary("rkv_cache_evict_host", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { host_cache_ref(cache) }?;
        check_out(out_evicted, "out_evicted")?;
        let n = c.cache.evict_host(n_tokens).map_err(st)?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_evicted.write(n) };
        Ok(())
    })
}
