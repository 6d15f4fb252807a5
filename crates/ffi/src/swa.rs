//! The sliding-window (SWA) component through the C ABI (an extension of version 1): a
//! cache made with `rkv_policy_options.swa_window > 0` matches SWA-valid prefixes, holds its
//! locks' windows, and evicts with `rkv_evict_kv`, which says per node what was freed.

use std::ffi::c_void;

use radixkv_core::tree::{EvictTarget, Freed};

use crate::boundary::fail;
use crate::pool::evict_into;
use crate::types::{RKV_FREED_FULL, RKV_FREED_SWA, rkv_cache, rkv_freed_fn, rkv_status};

/// Frees at least `n_tokens` tokens' KV of the kind `target` names (an
/// `rkv_evict_target`; fewer only if nothing more of that kind can go) and writes the
/// count freed of that kind to `*out_evicted` (required). `free_fn(ctx, freed, slots, n)`
/// (required) gets each evicted node's slots once, with `freed` saying what went:
/// `RKV_FREED_FULL | RKV_FREED_SWA` (a leaf, whole), `RKV_FREED_SWA` (an SWA tombstone: its
/// full KV stays cached), `RKV_FREED_FULL` (a tombstone's full KV, or any leaf of a cache
/// without a window). `RKV_EVICT_TARGET_FULL` takes unpinned leaves in the policy's order
/// (`rkv_evict`, telling which still had SWA KV); `RKV_EVICT_TARGET_SWA` takes nodes whose
/// SWA KV no window lock holds, least recently used first (nothing on a cache without a
/// window). In pool mode every slot whose full KV was freed goes back to the pool after
/// `free_fn` has seen it (it must not free it again); the SWA KV is the caller's to free.
/// `free_fn` runs on this thread with no cache lock held and must not call into the same
/// cache. An unknown `target` is `RKV_INVALID_ARGUMENT`, a NULL `free_fn`
/// `RKV_NULL_ARGUMENT`; nothing changes then. Thread-safe; linearizable per node.
///
/// # Safety
/// `cache` is NULL or live; `free_fn` NULL or a function safe to call with `ctx` and a
/// slot array; `out_evicted` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_evict_kv(
    cache: *const rkv_cache,
    target: u32,
    n_tokens: usize,
    free_fn: rkv_freed_fn,
    ctx: *mut c_void,
    out_evicted: *mut usize,
) -> rkv_status {
    let evict = |c: &radixkv_core::cache::Cache| {
        let target = match target {
            0 => EvictTarget::Full,
            1 => EvictTarget::Swa,
            t => {
                return Err(radixkv_core::error::Error::InvalidArgument(format!(
                    "target = {t} is not an rkv_evict_target (RKV_EVICT_TARGET_FULL = 0, \
                     RKV_EVICT_TARGET_SWA = 1); nothing was evicted"
                )));
            }
        };
        let f = free_fn.expect("checked non-null below");
        c.evict_kv(target, n_tokens, &mut |what: Freed, slots: &[u32]| {
            let bits = if what.full { RKV_FREED_FULL } else { 0 }
                | if what.swa { RKV_FREED_SWA } else { 0 };
            // SAFETY: the caller guarantees `f` may be called with `ctx` and an array;
            // `slots` is a live, non-empty slice for the duration of the call.
            unsafe { f(ctx, bits, slots.as_ptr(), slots.len()) }
        })
    };
    if free_fn.is_none() {
        return crate::boundary::boundary("rkv_evict_kv", || {
            Err(fail(
                rkv_status::RKV_NULL_ARGUMENT,
                "free_fn is NULL: rkv_evict_kv reports every node it frees through it",
            ))
        });
    }
    // SAFETY: the caller's contract for `cache` and `out_evicted` is `evict_into`'s.
    unsafe { evict_into("rkv_evict_kv", cache, out_evicted, "out_evicted", true, evict) }
}
