//! Inserts: slot lists or runs, with or without a lock, with or without options.

use radixkv_core::slot_run::SlotRun;

use crate::args::{
    cache_ref, check_opt_in, check_out, input, input_runs, insert_options, reserve_handle,
};
use crate::boundary::{Res, boundary};
use crate::refusal::{runs_refusal, slot_refusal};
use crate::types::{rkv_cache, rkv_insert_options, rkv_lock, rkv_slot_run, rkv_status};

/// The token and slot arrays of `rkv_insert` and `rkv_insert_lock`.
///
/// # Safety
/// As [`input`], for both arrays.
pub(crate) unsafe fn insert_arrays<'a>(
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
) -> Res<(&'a [u32], &'a [u32])> {
    // SAFETY: the caller's contract is `input`'s, for both arrays.
    unsafe {
        Ok((
            input(tokens, n_tokens, "tokens", "n_tokens")?,
            input(slots, n_tokens, "slots", "n_tokens")?,
        ))
    }
}

/// The token and run arrays of `rkv_insert_runs` and `rkv_insert_lock_runs`.
///
/// # Safety
/// As [`input`], for both arrays.
pub(crate) unsafe fn insert_runs_arrays<'a>(
    tokens: *const u32,
    n_tokens: usize,
    runs: *const rkv_slot_run,
    n_runs: usize,
) -> Res<(&'a [u32], &'a [SlotRun])> {
    // SAFETY: the caller's contract is `input`'s, for both arrays.
    unsafe {
        Ok((
            input(tokens, n_tokens, "tokens", "n_tokens")?,
            input_runs(runs, n_runs, "runs", "n_runs")?,
        ))
    }
}

// ---------------------------------------------------------------------------------------
// Insert.

/// Inserts `tokens[0..n_tokens]` with `slots[0..n_tokens]` in namespace `ns` (the length is
/// cut down to a multiple of page_size). Writes to `*out_existing` (required) how many
/// leading tokens were already cached: their given slots were not adopted. In pool mode the
/// call frees the slots it did not adopt itself (except those equal to the cached slot at
/// that position), and refuses whole with `RKV_INVALID_ARGUMENT` a slot outside the pool,
/// a free slot, or one cached at another position. In caller-managed mode the caller keeps
/// owning every slot that was not adopted. Arrays stay owned by the caller; either may be
/// NULL when `n_tokens == 0`. Priority 0 (`rkv_insert_ex` takes one). Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `tokens` and `slots` NULL or readable for `n_tokens` values;
/// `out_existing` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_insert(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    out_existing: *mut usize,
) -> rkv_status {
    boundary("rkv_insert", || {
        // SAFETY: the caller's contract is `insert_body`'s, and a NULL `opts` is allowed.
        unsafe { insert_body(cache, ns, tokens, slots, n_tokens, std::ptr::null(), out_existing) }
    })
}

/// `rkv_insert` with per-insert options (an extension of version 1): `*opts` (NULL: the
/// defaults, which make this `rkv_insert`) carries the insert's eviction priority (an
/// `int64_t` that must fit an `int32_t`, else `RKV_INVALID_ARGUMENT` and nothing changes)
/// and what the same request inserted before (`inserted_len`, for the hit counts of
/// `RKV_EVICT_LFU` and `RKV_EVICT_SLRU`); see `rkv_insert_options`. `opts` is only read
/// during the call. Everything else as `rkv_insert`. Thread-safe.
///
/// # Safety
/// As `rkv_insert`; `opts` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_insert_ex(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
) -> rkv_status {
    boundary("rkv_insert_ex", || {
        // SAFETY: the caller's contract is `insert_body`'s.
        unsafe { insert_body(cache, ns, tokens, slots, n_tokens, opts, out_existing) }
    })
}

/// The body of `rkv_insert` and `rkv_insert_ex`, inside their panic boundary.
///
/// # Safety
/// As `rkv_insert_ex`.
pub(crate) unsafe fn insert_body(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
) -> Res<()> {
    // SAFETY: the caller passes NULL or a live cache that is not being freed.
    let c = unsafe { cache_ref(cache) }?;
    // SAFETY: the caller guarantees both arrays are readable for n_tokens (or NULL).
    let (t, s) = unsafe { insert_arrays(tokens, slots, n_tokens) }?;
    check_opt_in(opts, "opts")?;
    check_out(out_existing, "out_existing")?;
    // SAFETY: NULL or aligned (`check_opt_in`), and readable by the caller's contract.
    let o = unsafe { insert_options(opts) }?;
    let existing = c
        .cache
        .insert_with(ns, t, s, o)
        .map_err(|e| slot_refusal(e, &("slots", s), c.cache.pool()))?;
    // SAFETY: `out_existing` passed `check_out`; writable by the caller's contract.
    unsafe { out_existing.write(existing) };
    Ok(())
}

/// `rkv_insert`, and pin `tokens[0..n]` (n cut down to a multiple of page_size) atomically
/// with it; the lock goes to `*out_lock` (required), owned by the caller, to be released
/// once with `rkv_release`. For chunked prefill: release the previous chunk's lock after
/// this succeeds. Priority 0 (`rkv_insert_lock_ex` takes one). Thread-safe.
///
/// # Safety
/// As `rkv_insert`; `out_lock` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_insert_lock(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    out_existing: *mut usize,
    out_lock: *mut rkv_lock,
) -> rkv_status {
    boundary("rkv_insert_lock", || {
        let none = std::ptr::null();
        // SAFETY: the caller's contract is `insert_lock_body`'s, and a NULL `opts` is allowed.
        unsafe {
            insert_lock_body(cache, ns, tokens, slots, n_tokens, none, out_existing, out_lock)
        }
    })
}

/// `rkv_insert_lock` with per-insert options, as `rkv_insert_ex` (an extension of version
/// 1): `*opts` (NULL: the defaults) carries the priority and `inserted_len`; a priority
/// outside `int32_t` is `RKV_INVALID_ARGUMENT`, and then nothing is inserted or pinned.
/// The lock goes to `*out_lock` (required), owned by the caller, to be released once with
/// `rkv_release`. Thread-safe.
///
/// # Safety
/// As `rkv_insert_lock`; `opts` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_insert_lock_ex(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
    out_lock: *mut rkv_lock,
) -> rkv_status {
    boundary("rkv_insert_lock_ex", || {
        // SAFETY: the caller's contract is `insert_lock_body`'s.
        unsafe {
            insert_lock_body(cache, ns, tokens, slots, n_tokens, opts, out_existing, out_lock)
        }
    })
}

/// The body of `rkv_insert_lock` and `rkv_insert_lock_ex`, inside their panic boundary.
///
/// # Safety
/// As `rkv_insert_lock_ex`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn insert_lock_body(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
    out_lock: *mut rkv_lock,
) -> Res<()> {
    // SAFETY: the caller passes NULL or a live cache that is not being freed.
    let c = unsafe { cache_ref(cache) }?;
    // SAFETY: the caller guarantees both arrays are readable for n_tokens (or NULL).
    let (t, s) = unsafe { insert_arrays(tokens, slots, n_tokens) }?;
    check_opt_in(opts, "opts")?;
    check_out(out_existing, "out_existing")?;
    check_out(out_lock, "out_lock")?;
    // SAFETY: NULL or aligned (`check_opt_in`), and readable by the caller's contract.
    let o = unsafe { insert_options(opts) }?;
    let handle = reserve_handle(c)?;
    let (existing, guard) = c
        .cache
        .insert_and_lock(ns, t, s, o)
        .map_err(|e| slot_refusal(e, &("slots", s), c.cache.pool()))?;
    let handle = handle.fill(guard.into_raw());
    // SAFETY: both passed `check_out`; writable by the caller's contract.
    unsafe {
        out_existing.write(existing);
        out_lock.write(handle);
    }
    Ok(())
}

/// `rkv_insert` with the slots given as runs of consecutive slots (an extension of version
/// 1): `runs[0..n_runs]` name the tokens' slots in token order (their lengths must add up to
/// `n_tokens`, and no run may be empty or reach past slot id 2^32 - 1: else
/// `RKV_INVALID_ARGUMENT`, changing nothing). As `rkv_alloc_runs` hands them out, so the
/// pool step and the new leaf take O(runs) instead of O(tokens). Everything else as
/// `rkv_insert`: in pool mode the runs past `*out_existing` (up to n) are adopted and the
/// other given slots go back to the pool, except those equal to the cached slot at their
/// position. Arrays stay owned by the caller; either may be NULL when its count is 0.
/// Priority 0 (`rkv_insert_runs_ex` takes one). Thread-safe.
///
/// # Safety
/// `cache` is NULL or live; `tokens` NULL or readable for `n_tokens` values; `runs` NULL
/// or readable for `n_runs` runs; `out_existing` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_insert_runs(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    runs: *const rkv_slot_run,
    n_runs: usize,
    out_existing: *mut usize,
) -> rkv_status {
    boundary("rkv_insert_runs", || {
        let none = std::ptr::null();
        // SAFETY: the caller's contract is `insert_runs_body`'s, and a NULL `opts` is allowed.
        unsafe { insert_runs_body(cache, ns, tokens, n_tokens, runs, n_runs, none, out_existing) }
    })
}

/// `rkv_insert_runs` with per-insert options, as `rkv_insert_ex` (an extension of version
/// 1): `*opts` (NULL: the defaults) carries the priority and `inserted_len`; a priority
/// outside `int32_t` is `RKV_INVALID_ARGUMENT`, changing nothing. Thread-safe.
///
/// # Safety
/// As `rkv_insert_runs`; `opts` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_insert_runs_ex(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    runs: *const rkv_slot_run,
    n_runs: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
) -> rkv_status {
    boundary("rkv_insert_runs_ex", || {
        // SAFETY: the caller's contract is `insert_runs_body`'s.
        unsafe { insert_runs_body(cache, ns, tokens, n_tokens, runs, n_runs, opts, out_existing) }
    })
}

/// The body of `rkv_insert_runs` and `rkv_insert_runs_ex`, inside their panic boundary.
///
/// # Safety
/// As `rkv_insert_runs_ex`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn insert_runs_body(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    runs: *const rkv_slot_run,
    n_runs: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
) -> Res<()> {
    // SAFETY: the caller passes NULL or a live cache that is not being freed.
    let c = unsafe { cache_ref(cache) }?;
    // SAFETY: the caller guarantees both arrays are readable for their counts (or NULL).
    let (t, r) = unsafe { insert_runs_arrays(tokens, n_tokens, runs, n_runs) }?;
    check_opt_in(opts, "opts")?;
    check_out(out_existing, "out_existing")?;
    // SAFETY: NULL or aligned (`check_opt_in`), and readable by the caller's contract.
    let o = unsafe { insert_options(opts) }?;
    let existing = c.cache.insert_with(ns, t, r, o).map_err(|e| runs_refusal(e, c, r, t.len()))?;
    // SAFETY: `out_existing` passed `check_out`; writable by the caller's contract.
    unsafe { out_existing.write(existing) };
    Ok(())
}

/// `rkv_insert_lock` with the slots given as runs, as in `rkv_insert_runs` (an extension of
/// version 1). The lock goes to `*out_lock` (required), owned by the caller, to be released
/// once with `rkv_release`. Priority 0 (`rkv_insert_lock_runs_ex` takes one). Thread-safe.
///
/// # Safety
/// As `rkv_insert_runs`; `out_lock` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_insert_lock_runs(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    runs: *const rkv_slot_run,
    n_runs: usize,
    out_existing: *mut usize,
    out_lock: *mut rkv_lock,
) -> rkv_status {
    boundary("rkv_insert_lock_runs", || {
        let none = std::ptr::null();
        let (out, lock) = (out_existing, out_lock);
        // SAFETY: the caller's contract is `insert_lock_runs_body`'s, and a NULL `opts` is
        // allowed.
        unsafe { insert_lock_runs_body(cache, ns, tokens, n_tokens, runs, n_runs, none, out, lock) }
    })
}

/// `rkv_insert_lock_runs` with per-insert options, as `rkv_insert_ex` (an extension of
/// version 1): `*opts` (NULL: the defaults) carries the priority and `inserted_len`; a
/// priority outside `int32_t` is `RKV_INVALID_ARGUMENT`, and then nothing is inserted or
/// pinned. The lock goes to `*out_lock` (required), owned by the caller, to be released
/// once with `rkv_release`. Thread-safe.
///
/// # Safety
/// As `rkv_insert_lock_runs`; `opts` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_insert_lock_runs_ex(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    runs: *const rkv_slot_run,
    n_runs: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
    out_lock: *mut rkv_lock,
) -> rkv_status {
    boundary("rkv_insert_lock_runs_ex", || {
        let (out, lock) = (out_existing, out_lock);
        // SAFETY: the caller's contract is `insert_lock_runs_body`'s.
        unsafe { insert_lock_runs_body(cache, ns, tokens, n_tokens, runs, n_runs, opts, out, lock) }
    })
}

/// The body of `rkv_insert_lock_runs` and `rkv_insert_lock_runs_ex`, inside their panic
/// boundary.
///
/// # Safety
/// As `rkv_insert_lock_runs_ex`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn insert_lock_runs_body(
    cache: *const rkv_cache,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    runs: *const rkv_slot_run,
    n_runs: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
    out_lock: *mut rkv_lock,
) -> Res<()> {
    // SAFETY: the caller passes NULL or a live cache that is not being freed.
    let c = unsafe { cache_ref(cache) }?;
    // SAFETY: the caller guarantees both arrays are readable for their counts (or NULL).
    let (t, r) = unsafe { insert_runs_arrays(tokens, n_tokens, runs, n_runs) }?;
    check_opt_in(opts, "opts")?;
    check_out(out_existing, "out_existing")?;
    check_out(out_lock, "out_lock")?;
    // SAFETY: NULL or aligned (`check_opt_in`), and readable by the caller's contract.
    let o = unsafe { insert_options(opts) }?;
    let handle = reserve_handle(c)?;
    let (existing, lock) = c
        .cache
        .insert_and_lock(ns, t, r, o)
        .map(|(e, l)| (e, l.into_raw()))
        .map_err(|e| runs_refusal(e, c, r, t.len()))?;
    let handle = handle.fill(lock);
    // SAFETY: both passed `check_out`; writable by the caller's contract.
    unsafe {
        out_existing.write(existing);
        out_lock.write(handle);
    }
    Ok(())
}
