//! Namespaces (an extension of version 1): drop one, its counts, how many there are.

use std::ffi::c_void;

use radixkv_core::cache::Cache;

use crate::args::{cache_ref, check_out};
use crate::boundary::boundary;
use crate::pool::evict_into;
use crate::types::{rkv_cache, rkv_free_fn, rkv_status};

// ---------------------------------------------------------------------------------------
// Namespaces (an extension of version 1).

/// Counts of one namespace (`rkv_cache_namespace_stats`), an extension of version 1. A plain
/// value owned by the caller. Under concurrent calls each field is read atomically but the
/// fields are not one atomic snapshot; at quiescence
/// `cached_tokens == evictable_tokens + protected_tokens`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rkv_namespace_stats {
    /// Tokens cached in the namespace.
    pub cached_tokens: u64,
    /// Cached and not pinned by any lock.
    pub evictable_tokens: u64,
    /// Cached and pinned.
    pub protected_tokens: u64,
    /// Tree nodes (edges) of the namespace, its root excluded.
    pub nodes: u64,
}

/// Evicts every unpinned page of namespace `ns` (a tenant offboarded, a LoRA adapter
/// unloaded) and writes the count of tokens freed to `*out_freed` (required); an extension
/// of version 1. Pinned pages stay cached until their locks are released (a later call
/// drops them then). An unknown namespace, or one with nothing evictable, frees nothing:
/// `*out_freed = 0` and `RKV_OK`, not an error. A namespace whose last page goes is
/// reclaimed (`rkv_namespace_count` no longer counts it); inserting into it again later
/// simply recreates it. Slots exactly as `rkv_evict`: `free_fn(ctx, slots, n)` receives
/// every freed slot exactly once, on this thread, before the call returns, and the slots
/// then belong to the caller (caller-managed mode); in pool mode the slots go back to the
/// pool and `free_fn` may be NULL (if given, it is told about them but must not free them
/// again). Without a pool a NULL `free_fn` is `RKV_NULL_ARGUMENT`. `free_fn` must return
/// normally and must not call into the same cache. Other namespaces are not touched.
/// Thread-safe (concurrent inserts into `ns` may leave new pages cached).
///
/// # Safety
/// `cache` is NULL or live; `free_fn` NULL or a function safe to call with `ctx` and a
/// slot array; `out_freed` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_drop_namespace(
    cache: *const rkv_cache,
    ns: u64,
    free_fn: rkv_free_fn,
    ctx: *mut c_void,
    out_freed: *mut usize,
) -> rkv_status {
    let drop_ns = |cache: &Cache| match free_fn {
        None => cache.drop_namespace(ns, None),
        Some(f) => {
            let mut tell = |slots: &[u32]| {
                if !slots.is_empty() {
                    // SAFETY: the caller guarantees `f` may be called with `ctx` and an
                    // array; `slots` is a live slice for the duration of the call.
                    unsafe { f(ctx, slots.as_ptr(), slots.len()) }
                }
            };
            cache.drop_namespace(ns, Some(&mut tell))
        }
    };
    // SAFETY: the caller's contract for `cache` and `out_freed` is `evict_into`'s.
    unsafe {
        evict_into("rkv_drop_namespace", cache, out_freed, "out_freed", free_fn.is_some(), drop_ns)
    }
}

/// Writes the counts of namespace `ns` to `*out_stats` (required, owned by the caller); an
/// extension of version 1. An unknown namespace (never used, or reclaimed after its last
/// page went) is all zeros and `RKV_OK`, not an error. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `out_stats` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_cache_namespace_stats(
    cache: *const rkv_cache,
    ns: u64,
    out_stats: *mut rkv_namespace_stats,
) -> rkv_status {
    boundary("rkv_cache_namespace_stats", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out(out_stats, "out_stats")?;
        let s = c.cache.namespace_stats(ns);
        let s = rkv_namespace_stats {
            cached_tokens: s.cached_tokens,
            evictable_tokens: s.evictable_tokens,
            protected_tokens: s.protected_tokens,
            nodes: s.nodes,
        };
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_stats.write(s) };
        Ok(())
    })
}

/// Writes the number of live namespaces (those with at least one cached page; an empty
/// namespace is reclaimed) to `*out_count` (required); an extension of version 1 (the count
/// is not a field of `rkv_stats`, whose size version 1 fixes). Exact at quiescence; under
/// concurrent calls a count of that moment. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `out_count` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_namespace_count(
    cache: *const rkv_cache,
    out_count: *mut u64,
) -> rkv_status {
    boundary("rkv_namespace_count", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out(out_count, "out_count")?;
        let n = c.cache.tree().namespace_count();
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_count.write(n) };
        Ok(())
    })
}
