//! The tier's match (device prefix and host extension), locks and their release.

use super::*;

// ---------------------------------------------------------------------------------------
// Match, locks.

/// Longest device prefix of `tokens[0..n_tokens]` in namespace `ns` and how far host
/// copies extend it (SGLang's `host_hit_length`), an extension of version 1: writes the
/// device match length to `*out_len` (required), its slots to `out_slots[0..*out_len]`, and
/// the host tokens right after it to `*out_host_len` (required). With `out_lock` non-NULL the device prefix is pinned
/// (exactly as `rkv_match_lock`) and the lock written there, the caller's to release with
/// `rkv_tier_release` exactly once (also for a match of 0 tokens); with NULL nothing is
/// pinned (an estimate under concurrency). Slots as `rkv_match`: `out_slots` may be NULL
/// when `out_cap == 0` (then only the lengths are produced, and with a lock only when the
/// match is empty); if the match does not fit `out_cap` the call returns
/// `RKV_BUFFER_TOO_SMALL` with only `*out_len` written, nothing pinned, nothing counted.
/// `out_cap = n_tokens` always suffices. Load the host part with `rkv_tier_load_back`.
/// Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `tokens[0..n_tokens]` readable (or NULL when 0);
/// `out_slots[0..out_cap]` writable (or NULL); `out_len`, `out_host_len`, `out_lock` NULL
/// or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_match(
    tier: *const rkv_tier,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    out_slots: *mut u32,
    out_cap: usize,
    out_len: *mut usize,
    out_host_len: *mut usize,
    out_lock: *mut rkv_lock,
) -> rkv_status {
    boundary("rkv_tier_match", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        // SAFETY: the caller guarantees tokens[0..n_tokens] is readable (or NULL).
        let tk = unsafe { input(tokens, n_tokens, "tokens", "n_tokens") }?;
        check_out_array(out_slots, out_cap, "out_slots", "out_cap")?;
        check_out(out_len, "out_len")?;
        check_out(out_host_len, "out_host_len")?;
        let pin = !out_lock.is_null();
        if pin {
            check_out(out_lock, "out_lock")?;
        }
        // SAFETY: `out_len` passed `check_out` and is writable by the caller's contract.
        let (m, lock, slots) = unsafe { match_in(t.door(), ns, tk, out_cap, pin, out_len) }?;
        // SAFETY: `out_slots` passed `check_out_array` with `out_cap >= m.device_len`
        // (`match_in` checked); `tk` is not used after this; the single outputs passed
        // `check_out`.
        unsafe {
            write_array(out_slots, &slots);
            out_len.write(m.device_len);
            out_host_len.write(m.host_len);
            if let Some(l) = lock {
                out_lock.write(l);
            }
        }
        Ok(())
    })
}

/// The match of `rkv_tier_match` and `rkv_match_ex` on `d`: the device prefix of `tk`
/// (pinned when `pin`, its lock put in `d`'s table and its handle returned), how far host
/// copies extend it, and its slots (at most `out_cap` of them: the caller writes them to
/// its buffer once `tk` is no longer used, as the query and the buffer may overlap). When
/// they do not fit `out_cap`: `RKV_BUFFER_TOO_SMALL` with the match length written to
/// `*too_small_len` alone, nothing pinned (and, when the buffer is short of `tk`, nothing
/// counted: it measures first).
///
/// # Safety
/// `too_small_len` passed `check_out` and is writable.
pub(crate) unsafe fn match_in(
    d: Door<'_>,
    ns: u64,
    tk: &[u32],
    out_cap: usize,
    pin: bool,
    too_small_len: *mut usize,
) -> Res<(PrefixMatch, Option<rkv_lock>, Vec<u32>)> {
    let mut slots = Vec::new();
    let too_small = |m: usize, why: &str| {
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { too_small_len.write(m) };
        Err(too_small_slots(out_cap, m, why))
    };
    if out_cap < tk.len() {
        // Measure first, so a refusal pins, splits and counts nothing.
        let m = d.cache.tree().match_unrecorded(ns, tk, &mut slots);
        if m > out_cap {
            return too_small(m, "; nothing was pinned (pass out_cap = n_tokens)");
        }
    }
    let handle = if pin { Some(reserve_in(d)?) } else { None };
    let (lock, m) = if pin {
        let (l, m) = d.cache.lookup_and_lock(ns, tk, &mut slots);
        (Some(l.into_raw()), m)
    } else {
        (None, d.cache.lookup(ns, tk, &mut slots))
    };
    if m.device_len > out_cap {
        if let Some(l) = lock {
            let _ = d.cache.release(l);
        }
        let why = "; a concurrent insert grew the match during the call; nothing was pinned";
        return too_small(m.device_len, why);
    }
    let lock = match (handle, lock) {
        (Some(h), Some(l)) => Some(h.fill(l)),
        _ => None,
    };
    Ok((m, lock, slots))
}

/// Releases a lock of this tier (from `rkv_tier_match`, `rkv_tier_insert_lock_ex` or a
/// load-back's result): its pages are no longer pinned by it and the handle becomes
/// invalid. Twice, 0, unknown or another cache's or tier's handle: `RKV_INVALID_LOCK`,
/// nothing changed. Thread-safe.
///
/// # Safety
/// `tier` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_release(tier: *const rkv_tier, lock: rkv_lock) -> rkv_status {
    boundary("rkv_tier_release", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        let l = t.locks.remove(lock).ok_or_else(|| {
            fail(rkv_status::RKV_INVALID_LOCK, format!("lock {lock:#x} {}", t.locks.explain(lock)))
        })?;
        t.cache.release(l).map_err(|e| fail(rkv_status::from(&e), format!("lock {lock:#x}: {e}")))
    })
}

/// Writes to `*out_len` (required) the number of tokens a lock of this tier pins.
/// `RKV_INVALID_LOCK` for an unknown, released or foreign handle. Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `out_len` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_lock_len(
    tier: *const rkv_tier,
    lock: rkv_lock,
    out_len: *mut usize,
) -> rkv_status {
    boundary("rkv_tier_lock_len", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        check_out(out_len, "out_len")?;
        let n = t.locks.with(lock, |l| l.len()).ok_or_else(|| {
            fail(rkv_status::RKV_INVALID_LOCK, format!("lock {lock:#x} {}", t.locks.explain(lock)))
        })?;
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_len.write(n) };
        Ok(())
    })
}
