//! The tier's device slots, inserts and evictions (device and host).

use super::*;

// ---------------------------------------------------------------------------------------
// Slots, inserts, eviction.

/// Allocates `n_slots` device slots into `out_slots[0..n_slots]` (NULL allowed when 0), all
/// or nothing, as `rkv_alloc` (evicting when free slots are short: such evictions go through
/// the host tier, so under `RKV_WRITE_BACK` they copy pages to the host first). `n_slots`
/// must be a multiple of the page size. `RKV_OUT_OF_SLOTS` (nothing changed) when even
/// evicting cannot find them. The caller owns the slots until it inserts them or frees them
/// with `rkv_tier_free_slots`. Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `out_slots` NULL or writable for `n_slots` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_alloc(
    tier: *const rkv_tier,
    n_slots: usize,
    out_slots: *mut u32,
) -> rkv_status {
    boundary("rkv_tier_alloc", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        if n_slots > 0 && out_slots.is_null() {
            return Err(fail(
                rkv_status::RKV_NULL_ARGUMENT,
                format!("out_slots is NULL but n_slots = {n_slots} (NULL is allowed only with 0)"),
            ));
        }
        let pool_slots = t.cache.options().pool_slots;
        if n_slots > pool_slots {
            return Err(more_than_pool(n_slots, pool_slots));
        }
        check_out_array(out_slots, n_slots, "out_slots", "n_slots")?;
        let p = t.cache.page_size();
        if !n_slots.is_multiple_of(p) {
            return Err(bad(format!(
                "n_slots = {n_slots} is not a multiple of the page size {p} (slots come in \
                 whole pages)"
            )));
        }
        let mut v = Vec::new();
        t.cache.alloc(n_slots, &mut v).map_err(st)?;
        // SAFETY: passed `check_out_array` with cap `n_slots == v.len()`.
        unsafe { write_array(out_slots, &v) };
        Ok(())
    })
}

/// Returns device slots `slots[0..n_slots]` (allocated with `rkv_tier_alloc`, never
/// inserted) to the pool, as `rkv_free`: a free or cached slot is `RKV_DOUBLE_FREE`, one
/// outside the pool `RKV_INVALID_ARGUMENT`; either refuses the whole call. Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `slots` NULL or readable for `n_slots` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_free_slots(
    tier: *const rkv_tier,
    slots: *const u32,
    n_slots: usize,
) -> rkv_status {
    boundary("rkv_tier_free_slots", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        // SAFETY: the caller guarantees slots[0..n_slots] is readable (or NULL).
        let s = unsafe { input(slots, n_slots, "slots", "n_slots") }?;
        t.cache.free(s).map_err(|e| slot_refusal(e, &("slots", s), t.cache.pool()))
    })
}

/// The shared body of the inserts.
///
/// # Safety
/// As `rkv_tier_insert_lock_ex`, `out_lock` NULL meaning "no lock".
#[allow(clippy::too_many_arguments)]
unsafe fn insert_body(
    tier: *const rkv_tier,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
    out_lock: Option<*mut rkv_lock>,
) -> Res<()> {
    // SAFETY: the caller passes NULL or a live tier that is not being freed.
    let t = unsafe { tier_ref(tier) }?;
    // SAFETY: the caller guarantees both arrays are readable for n_tokens (or NULL).
    let (tk, sl) = unsafe {
        (
            input(tokens, n_tokens, "tokens", "n_tokens")?,
            input(slots, n_tokens, "slots", "n_tokens")?,
        )
    };
    check_opt_in(opts, "opts")?;
    check_out(out_existing, "out_existing")?;
    if let Some(l) = out_lock {
        check_out(l, "out_lock")?;
    }
    // SAFETY: NULL or aligned (checked); readable by the caller's contract.
    let io: InsertOptions = unsafe { insert_options(opts) }?;
    let refuse = |e| slot_refusal(e, &("slots", sl), t.cache.pool());
    match out_lock {
        None => {
            let existing = t.cache.insert_with(ns, tk, sl, io).map_err(refuse)?;
            // SAFETY: passed `check_out`; writable by the caller's contract.
            unsafe { out_existing.write(existing) };
        }
        Some(out) => {
            let h = reserve(t)?;
            let (existing, lock) = t
                .cache
                .insert_and_lock(ns, tk, sl, io)
                .map(|(e, g)| (e, g.into_raw()))
                .map_err(refuse)?;
            // SAFETY: both passed `check_out`; writable by the caller's contract.
            unsafe {
                out_existing.write(existing);
                out.write(h.fill(lock));
            }
        }
    }
    Ok(())
}

/// Inserts `tokens[0..n_tokens]` with their device `slots[0..n_tokens]` in namespace `ns`
/// (cut to whole pages), as `rkv_insert` in pool mode (slots of a page must be one whole
/// pool page, allocated with `rkv_tier_alloc`; the slots not adopted go back to the pool),
/// then backs the pages up as the write policy says: the copy starts now and, until it
/// completes (`rkv_tier_poll`), keeps those pages pinned on the device. Writes the tokens
/// that were cached already to `*out_existing` (required). Refusals as `rkv_insert`
/// (nothing changed). Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `tokens`, `slots` NULL or readable for `n_tokens` values;
/// `out_existing` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_insert(
    tier: *const rkv_tier,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    out_existing: *mut usize,
) -> rkv_status {
    boundary("rkv_tier_insert", || {
        let none = std::ptr::null();
        // SAFETY: the caller's contract is `insert_body`'s, with no options and no lock.
        unsafe { insert_body(tier, ns, tokens, slots, n_tokens, none, out_existing, None) }
    })
}

/// `rkv_tier_insert` with per-insert options (`opts`, NULL for the defaults; as
/// `rkv_insert_ex`). Thread-safe.
///
/// # Safety
/// As `rkv_tier_insert`; `opts` NULL or a readable `rkv_insert_options`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_insert_ex(
    tier: *const rkv_tier,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
) -> rkv_status {
    boundary("rkv_tier_insert_ex", || {
        // SAFETY: the caller's contract is `insert_body`'s, with no lock.
        unsafe { insert_body(tier, ns, tokens, slots, n_tokens, opts, out_existing, None) }
    })
}

/// `rkv_tier_insert_ex` that also pins the inserted prefix (whole pages) for the caller:
/// the lock goes to `*out_lock` (required), to release with `rkv_tier_release` exactly
/// once. Thread-safe.
///
/// # Safety
/// As `rkv_tier_insert_ex`; `out_lock` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_insert_lock_ex(
    tier: *const rkv_tier,
    ns: u64,
    tokens: *const u32,
    slots: *const u32,
    n_tokens: usize,
    opts: *const rkv_insert_options,
    out_existing: *mut usize,
    out_lock: *mut rkv_lock,
) -> rkv_status {
    boundary("rkv_tier_insert_lock_ex", || {
        if out_lock.is_null() {
            return Err(fail(rkv_status::RKV_NULL_ARGUMENT, "out_lock is NULL"));
        }
        // SAFETY: the caller's contract is `insert_body`'s.
        unsafe {
            insert_body(tier, ns, tokens, slots, n_tokens, opts, out_existing, Some(out_lock))
        }
    })
}

/// Evicts at least `n_tokens` device tokens (unpinned leaves, by the device policy) and
/// writes the count freed to `*out_evicted` (required). The slots go back to the device
/// pool; pages with a host copy stay on the host (host-only), and under `RKV_WRITE_BACK` a
/// page without one is copied to the host first. Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `out_evicted` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_evict(
    tier: *const rkv_tier,
    n_tokens: usize,
    out_evicted: *mut usize,
) -> rkv_status {
    boundary("rkv_tier_evict", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        check_out(out_evicted, "out_evicted")?;
        let n = t.cache.evict(n_tokens, None).map_err(st)?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_evicted.write(n) };
        Ok(())
    })
}

/// Evicts at least `n_tokens` host tokens (host-only leaves, by the host policy; never a
/// page being copied, pinned by a load-back, or still on the device) and writes the host
/// tokens freed to `*out_evicted` (required; fewer when nothing more is evictable).
/// Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `out_evicted` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_evict_host(
    tier: *const rkv_tier,
    n_tokens: usize,
    out_evicted: *mut usize,
) -> rkv_status {
    boundary("rkv_tier_evict_host", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        check_out(out_evicted, "out_evicted")?;
        let n = t.cache.evict_host(n_tokens).map_err(st)?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_evicted.write(n) };
        Ok(())
    })
}
