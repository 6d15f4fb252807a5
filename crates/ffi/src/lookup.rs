//! Lookups: the plain and the locking match (slot lists and runs), the match with options
//! and a result (`rkv_match_ex`: device and host lengths), a lock's length, and release.

use radixkv_core::slot_run::SlotRun;

use crate::args::{
    cache_ref, check_opt_in, check_out, check_out_array, disjoint, input, invalid_lock, read_sized,
    reserve_handle, write_array,
};
use crate::boundary::{Res, boundary, fail};
use crate::refusal::{too_small_runs, too_small_slots};
use crate::types::{
    RKV_MATCH_LOCK, rkv_cache, rkv_lock, rkv_match_options, rkv_match_result, rkv_slot_run,
    rkv_status,
};

// ---------------------------------------------------------------------------------------
// Match.

/// Longest cached prefix of `tokens[0..n_tokens]` in namespace `ns` (a plain match: it pins
/// nothing, so under concurrency it is only an estimate; admit requests with
/// `rkv_match_lock`). Writes the match length to `*out_len` (required) and its slots to
/// `out_slots[0..*out_len]`. `out_slots` may be NULL when `out_cap == 0`: then only
/// `*out_len` is produced and the status is `RKV_OK`. If `out_cap > 0` is smaller than the
/// match, returns `RKV_BUFFER_TOO_SMALL` with the match length in `*out_len` (nothing else
/// written). On `RKV_OK`, `out_slots[*out_len..out_cap]` is scratch: a match that retried
/// may have written there. `tokens` may be NULL when `n_tokens == 0`. All arrays stay owned
/// by the caller. Thread-safe; lock-free.
///
/// # Safety
/// `cache` is NULL or live; `tokens[0..n_tokens]` readable (or NULL); `out_slots[0..out_cap]`
/// writable (or NULL); `out_len` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_match(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    out_slots: *mut u32,
    out_cap: usize,
    out_len: *mut usize,
) -> rkv_status {
    boundary("rkv_match", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller guarantees tokens[0..n_tokens] is readable (or NULL).
        let t = unsafe { input(tokens, n_tokens, "tokens", "n_tokens") }?;
        check_out_array(out_slots, out_cap, "out_slots", "out_cap")?;
        check_out(out_len, "out_len")?;
        if out_cap >= t.len() && out_cap > 0 && disjoint(out_slots, out_cap, tokens, t.len()) {
            // A buffer that holds any match and does not overlap the query: the match writes
            // the slots straight into it (no vector, no second copy). The call cannot fail
            // from here on, so the buffer is written only on success; past `*out_len` it may
            // hold slots of a retried attempt (the header says `out_slots[m..]` is scratch).
            // SAFETY: `out_slots[0..out_cap]` passed `check_out_array` and is writable by the
            // caller's contract; it does not overlap `tokens`, the only other memory read.
            let mut sink = unsafe { radixkv_core::tree::OutBuf::new(out_slots, out_cap) };
            let m = c.cache.match_prefix(ns, t, &mut sink);
            debug_assert_eq!(m, sink.len());
            // SAFETY: `out_len` passed `check_out`; the caller guarantees it is writable.
            unsafe { out_len.write(m) };
            return Ok(());
        }
        let mut slots = Vec::new();
        let m = c.cache.match_prefix(ns, t, &mut slots);
        debug_assert_eq!(m, slots.len());
        if out_cap > 0 && m > out_cap {
            // SAFETY: `out_len` passed `check_out`; the caller guarantees it is writable.
            unsafe { out_len.write(m) };
            return Err(too_small_slots(
                out_cap,
                m,
                "; pass out_cap >= n_tokens, or 0 for the length only",
            ));
        }
        if out_cap > 0 {
            // SAFETY: checked above with cap `out_cap >= m`; `t` is not used after this.
            unsafe { write_array(out_slots, &slots[..m]) };
        }
        // SAFETY: as above.
        unsafe { out_len.write(m) };
        Ok(())
    })
}

/// Match and pin atomically: like `rkv_match`, and the pages of the match stay cached with
/// the same slots until the lock written to `*out_lock` (required) is released with
/// `rkv_release` (or the cache is freed). `out_cap` must be >= the match (pass `n_tokens` to
/// be safe); `out_slots` may be NULL only when `out_cap == 0`. On `RKV_BUFFER_TOO_SMALL`
/// nothing is pinned, no edge is split, and only `*out_len` is written. Always yields a lock
/// on `RKV_OK`, also for a match of length 0; the caller owns it and must release it exactly
/// once. Thread-safe.
///
/// # Safety
/// As `rkv_match`; `out_lock` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_match_lock(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    out_slots: *mut u32,
    out_cap: usize,
    out_len: *mut usize,
    out_lock: *mut rkv_lock,
) -> rkv_status {
    boundary("rkv_match_lock", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller guarantees tokens[0..n_tokens] is readable (or NULL).
        let t = unsafe { input(tokens, n_tokens, "tokens", "n_tokens") }?;
        check_out_array(out_slots, out_cap, "out_slots", "out_cap")?;
        check_out(out_len, "out_len")?;
        check_out(out_lock, "out_lock")?;
        let mut slots = Vec::new();
        // A buffer that may be too small: measure first with a plain match, so a refusal
        // splits no edge (the locking match splits where the match ends).
        if out_cap < t.len() {
            let m = c.cache.tree().match_unrecorded(ns, t, &mut slots);
            if m > out_cap {
                // SAFETY: `out_len` passed `check_out`; the caller guarantees it is writable.
                unsafe { out_len.write(m) };
                return Err(too_small_slots(
                    out_cap,
                    m,
                    "; nothing was pinned (pass out_cap = n_tokens)",
                ));
            }
        }
        let handle = reserve_handle(c)?;
        if out_cap >= t.len() && out_cap > 0 && disjoint(out_slots, out_cap, tokens, t.len()) {
            // As in `rkv_match`: straight into the caller's buffer, which holds any match, so
            // nothing can fail after the pins.
            // SAFETY: as in `rkv_match`: a writable buffer disjoint from the query.
            let mut sink = unsafe { radixkv_core::tree::OutBuf::new(out_slots, out_cap) };
            let lock = c.cache.match_and_lock(ns, t, &mut sink).into_raw();
            let m = sink.len();
            let handle = handle.fill(lock);
            // SAFETY: `out_len` and `out_lock` passed `check_out`; writable by contract.
            unsafe {
                out_len.write(m);
                out_lock.write(handle);
            }
            return Ok(());
        }
        let guard = c.cache.match_and_lock(ns, t, &mut slots);
        let m = slots.len();
        if m > out_cap {
            // Grown since the check (a racing insert): nothing stays pinned.
            drop(guard);
            // SAFETY: `out_len` passed `check_out`; the caller guarantees it is writable.
            unsafe { out_len.write(m) };
            let why = "; a concurrent insert grew the match during the call; nothing was pinned";
            return Err(too_small_slots(out_cap, m, why));
        }
        let handle = handle.fill(guard.into_raw());
        // SAFETY: `out_slots` passed `check_out_array` with `out_cap >= m`; `t` is not used
        // after this; `out_len`, `out_lock` passed `check_out` and are writable by contract.
        unsafe {
            write_array(out_slots, &slots);
            out_len.write(m);
            out_lock.write(handle);
        }
        Ok(())
    })
}

/// The checked cache, query and run buffer of `rkv_match_runs` and `rkv_match_lock_runs`.
///
/// # Safety
/// `cache` is NULL or live and not freed during `'a`; `tokens[0..n_tokens]` readable (or
/// NULL) and not written during `'a`.
pub(crate) unsafe fn runs_args<'a>(
    cache: *const rkv_cache,
    tokens: *const u32,
    n_tokens: usize,
    out_runs: *mut rkv_slot_run,
    out_cap: usize,
) -> Res<(&'a rkv_cache, &'a [u32])> {
    // SAFETY: the caller passes NULL or a live cache that is not being freed.
    let c = unsafe { cache_ref(cache) }?;
    // SAFETY: the caller guarantees tokens[0..n_tokens] is readable (or NULL).
    let t = unsafe { input(tokens, n_tokens, "tokens", "n_tokens") }?;
    check_out_array(out_runs, out_cap, "out_runs", "out_cap")?;
    Ok((c, t))
}

/// `rkv_match` writing the slots as runs of consecutive slots (an extension of version 1):
/// `out_runs[0..*out_n_runs]` name the match's slots in token order, neighbours that
/// continue one another joined, so their lengths add up to `*out_len`; O(runs) to write
/// instead of O(tokens) when slots come in runs, as pools hand them out. `*out_len` and
/// `*out_n_runs` are required. `out_runs` may be NULL when `out_cap == 0`: then only the
/// two counts are produced and the status is `RKV_OK`. If `out_cap > 0` is smaller than the
/// number of runs, returns `RKV_BUFFER_TOO_SMALL` with both counts written (nothing else).
/// There are never more runs than matched tokens, so `out_cap = n_tokens` always suffices.
/// All arrays stay owned by the caller. Thread-safe; lock-free.
///
/// # Safety
/// As `rkv_match`, with `out_runs[0..out_cap]` writable (or NULL) and `out_n_runs` NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_match_runs(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    out_runs: *mut rkv_slot_run,
    out_cap: usize,
    out_n_runs: *mut usize,
    out_len: *mut usize,
) -> rkv_status {
    boundary("rkv_match_runs", || {
        // SAFETY: the caller's contract for these arguments is `runs_args`'.
        let (c, t) = unsafe { runs_args(cache, tokens, n_tokens, out_runs, out_cap) }?;
        check_out(out_n_runs, "out_n_runs")?;
        check_out(out_len, "out_len")?;
        let mut runs = Vec::new();
        let m = c.cache.match_prefix(ns, t, &mut runs);
        let fits = out_cap == 0 || runs.len() <= out_cap;
        // SAFETY: `out_runs` passed `check_out_array` and is written only when `out_cap >=
        // runs.len()` (`rkv_slot_run` has `SlotRun`'s layout, asserted in `types.rs`); `t` is not
        // used after this; `out_n_runs` and `out_len` passed `check_out` and are writable.
        unsafe {
            if fits && out_cap > 0 {
                write_array(out_runs.cast::<SlotRun>(), &runs);
            }
            out_n_runs.write(runs.len());
            out_len.write(m);
        }
        if fits {
            Ok(())
        } else {
            Err(too_small_runs(out_cap, runs.len(), m, "; out_cap = n_tokens always suffices"))
        }
    })
}

/// `rkv_match_lock` writing the slots as runs, as `rkv_match_runs` does (an extension of
/// version 1): `out_cap` must be >= the number of runs (pass `n_tokens` to be safe);
/// `out_runs` may be NULL only when `out_cap == 0`. On `RKV_BUFFER_TOO_SMALL` nothing is
/// pinned, no edge is split, and only `*out_n_runs` and `*out_len` are written. Always
/// yields a lock on `RKV_OK`, also for a match of length 0; the caller owns it and must
/// release it exactly once with `rkv_release`. Thread-safe.
///
/// # Safety
/// As `rkv_match_runs`; `out_lock` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_match_lock_runs(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    out_runs: *mut rkv_slot_run,
    out_cap: usize,
    out_n_runs: *mut usize,
    out_len: *mut usize,
    out_lock: *mut rkv_lock,
) -> rkv_status {
    boundary("rkv_match_lock_runs", || {
        // SAFETY: the caller's contract for these arguments is `runs_args`'.
        let (c, t) = unsafe { runs_args(cache, tokens, n_tokens, out_runs, out_cap) }?;
        check_out(out_n_runs, "out_n_runs")?;
        check_out(out_len, "out_len")?;
        check_out(out_lock, "out_lock")?;
        let mut runs = Vec::new();
        // As in `rkv_match_lock`: a buffer that may be too small is checked with a plain
        // match first, so a refusal splits no edge.
        if out_cap < t.len() {
            let m = c.cache.tree().match_unrecorded(ns, t, &mut runs);
            if runs.len() > out_cap {
                // SAFETY: both passed `check_out`; the caller guarantees they are writable.
                unsafe {
                    out_n_runs.write(runs.len());
                    out_len.write(m);
                }
                return Err(too_small_runs(
                    out_cap,
                    runs.len(),
                    m,
                    "; nothing was pinned (pass out_cap = n_tokens)",
                ));
            }
        }
        let handle = reserve_handle(c)?;
        let guard = c.cache.match_and_lock(ns, t, &mut runs);
        let m = guard.len();
        if runs.len() > out_cap {
            // Grown since the check (a racing insert): nothing stays pinned.
            drop(guard);
            // SAFETY: both passed `check_out`; the caller guarantees they are writable.
            unsafe {
                out_n_runs.write(runs.len());
                out_len.write(m);
            }
            let why = "; a concurrent insert grew the match during the call; nothing was pinned";
            return Err(too_small_runs(out_cap, runs.len(), m, why));
        }
        let handle = handle.fill(guard.into_raw());
        // SAFETY: `out_runs` passed `check_out_array` with `out_cap >= runs.len()` and has
        // `SlotRun`'s layout; `t` is not used after this; the three single outputs passed
        // `check_out` and are writable by contract.
        unsafe {
            write_array(out_runs.cast::<SlotRun>(), &runs);
            out_n_runs.write(runs.len());
            out_len.write(m);
            out_lock.write(handle);
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// The one match: options in, device and host lengths out.

/// The match with options and a result (an extension of version 1): the longest cached
/// device prefix of `tokens[0..n_tokens]` in namespace `ns`, its slots written to
/// `out_slots[0..device_len]`, and, on a cache made by `rkv_cache_new_host`, how far host
/// copies extend it (`host_len`; 0 without a host tier). `opts` (NULL: the defaults, a plain
/// match) is read only during the call; with `RKV_MATCH_LOCK` in `opts->flags` the device
/// prefix is pinned (exactly as `rkv_match_lock`) and the lock written to
/// `out_result->lock`, the caller's to release with `rkv_release` exactly once (also for a
/// match of 0 tokens). `*out_result` (required, owned by the caller) is written whole on
/// `RKV_OK`.
///
/// `out_slots` must hold the match (`out_cap = n_tokens` always suffices): when it does
/// not, `RKV_BUFFER_TOO_SMALL` with only `out_result->device_len` written, nothing pinned
/// and (when `out_cap < n_tokens`) nothing counted. One exception, as `rkv_match`:
/// `out_slots` NULL with `out_cap == 0` and no `RKV_MATCH_LOCK` asks for the lengths alone
/// (`RKV_OK`). With a host tier the call first finishes the copies that are done, and
/// counts the hits in `rkv_cache_tier_stats`. Load the host part with
/// `rkv_cache_load_back`. `RKV_INVALID_ARGUMENT` for `opts->size` other than
/// `sizeof(rkv_match_options)` or an unknown flag; nothing changed on any failure.
/// Thread-safe; lock-free without `RKV_MATCH_LOCK`.
///
/// # Safety
/// `cache` is NULL or live; `tokens[0..n_tokens]` readable (or NULL); `opts` NULL or a
/// readable `rkv_match_options`; `out_slots[0..out_cap]` writable (or NULL); `out_result`
/// NULL or writable.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn rkv_match_ex(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    opts: *const rkv_match_options,
    out_slots: *mut u32,
    out_cap: usize,
    out_result: *mut rkv_match_result,
) -> rkv_status {
    boundary("rkv_match_ex", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        // SAFETY: the caller guarantees tokens[0..n_tokens] is readable (or NULL).
        let t = unsafe { input(tokens, n_tokens, "tokens", "n_tokens") }?;
        check_opt_in(opts, "opts")?;
        // SAFETY: NULL or aligned (checked); readable by the caller's contract.
        let pin = unsafe { match_flags(opts) }? & RKV_MATCH_LOCK != 0;
        check_out_array(out_slots, out_cap, "out_slots", "out_cap")?;
        check_out(out_result, "out_result")?;
        if !pin && out_slots.is_null() && out_cap == 0 {
            let mut runs: Vec<SlotRun> = Vec::new();
            let m = c.cache.lookup(ns, t, &mut runs);
            let r = rkv_match_result { device_len: m.device_len, host_len: m.host_len, lock: 0 };
            // SAFETY: `out_result` passed `check_out`; writable by the caller's contract.
            unsafe { out_result.write(r) };
            return Ok(());
        }
        // SAFETY: `out_result` passed `check_out`, so its `device_len` field is a writable,
        // aligned `usize`; no reference to it is made.
        let len_at = unsafe { &raw mut (*out_result).device_len };
        // SAFETY: `len_at` is writable (above).
        let (m, lock, slots) =
            unsafe { crate::tier::match_in(c.door(), ns, t, out_cap, pin, len_at) }.map_err(
                |mut f| {
                    // The length goes to the result's field here, not to an `*out_len`.
                    f.msg = f.msg.replace("(*out_len = ", "(out_result->device_len = ");
                    f
                },
            )?;
        let r = rkv_match_result {
            device_len: m.device_len,
            host_len: m.host_len,
            lock: lock.unwrap_or(0),
        };
        // SAFETY: `out_slots` passed `check_out_array` with `out_cap >= m.device_len`
        // (`match_in` checked); `t` is not used after this; `out_result` passed `check_out`.
        unsafe {
            write_array(out_slots, &slots);
            out_result.write(r);
        }
        Ok(())
    })
}

/// The flags of match options `p` (NULL: 0), checked.
///
/// # Safety
/// `p` is NULL, or passed `check_opt_in` and points to a readable `rkv_match_options`.
unsafe fn match_flags(p: *const rkv_match_options) -> Res<u32> {
    if p.is_null() {
        return Ok(0);
    }
    // SAFETY: non-null and aligned; readable by the caller's contract.
    let o = unsafe { read_sized(p, "opts", "rkv_match_options") }?;
    if o.flags & !RKV_MATCH_LOCK != 0 {
        return Err(fail(
            rkv_status::RKV_INVALID_ARGUMENT,
            format!(
                "opts->flags = {:#x} has bits this library does not know (RKV_MATCH_LOCK = 1 \
                 is the only flag)",
                o.flags
            ),
        ));
    }
    Ok(o.flags)
}

// ---------------------------------------------------------------------------------------
// Locks.

/// Writes to `*out_len` (required) the number of tokens `lock` pins. `RKV_INVALID_LOCK` for
/// an unknown, released or foreign handle. Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `out_len` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_lock_len(
    cache: *const rkv_cache,
    lock: rkv_lock,
    out_len: *mut usize,
) -> rkv_status {
    boundary("rkv_lock_len", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        check_out(out_len, "out_len")?;
        let n = c.locks.with(lock, |l| l.len()).ok_or_else(|| invalid_lock(c, lock))?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_len.write(n) };
        Ok(())
    })
}

/// Releases `lock`: its pages are no longer pinned by it, and the handle becomes invalid.
/// Releasing twice, 0, an unknown handle or another cache's lock is `RKV_INVALID_LOCK` and
/// changes nothing. Of two threads releasing one handle at once, exactly one gets `RKV_OK`.
/// Thread-safe.
///
/// # Safety
/// `cache` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_release(cache: *const rkv_cache, lock: rkv_lock) -> rkv_status {
    boundary("rkv_release", || {
        // SAFETY: the caller passes NULL or a live cache that is not being freed.
        let c = unsafe { cache_ref(cache) }?;
        let l = c.locks.remove(lock).ok_or_else(|| invalid_lock(c, lock))?;
        c.cache.release(l).map_err(|e| fail(rkv_status::from(&e), format!("lock {lock:#x}: {e}")))
    })
}
