//! Load-backs: host pages copied back to the device, started, polled, waited for.

use super::*;

// ---------------------------------------------------------------------------------------
// Load-back.

/// Starts loading back the host pages that extend the device match of
/// `tokens[0..n_tokens]` in `ns`, at most `max_tokens` of them (`SIZE_MAX`: all): allocates
/// device slots (evicting as `rkv_tier_alloc`), pins the host copies and starts the copy.
/// Writes a ticket to `*out_ticket` (required); take the result with `rkv_tier_load_poll`
/// or `rkv_tier_load_wait` (exactly once: the result holds a lock; `rkv_tier_free` releases
/// results never taken). When nothing is worth loading the ticket is done at once and its
/// result says why (`RKV_LOAD_NOTHING_ON_HOST`, `RKV_LOAD_TOO_SHORT`), with a lock over the
/// device match alone. `RKV_OUT_OF_SLOTS` (nothing changed, no ticket) when the device
/// cannot hold the pages; `RKV_DEVICE_ERROR` (everything rolled back, no ticket) when the
/// copier refuses to start the copy. Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `tokens` NULL or readable for `n_tokens` values; `out_ticket`
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_load_back(
    tier: *const rkv_tier,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    max_tokens: usize,
    out_ticket: *mut u64,
) -> rkv_status {
    boundary("rkv_tier_load_back", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        // SAFETY: the caller's contract is `load_back_in`'s.
        unsafe { load_back_in(t.door(), ns, tokens, n_tokens, max_tokens, out_ticket) }
    })
}

/// The body of `rkv_tier_load_back` and `rkv_cache_load_back` on `d`.
///
/// # Safety
/// `tokens` NULL or readable for `n_tokens` values; `out_ticket` NULL or writable.
pub(crate) unsafe fn load_back_in(
    d: Door<'_>,
    ns: u64,
    tokens: *const u32,
    n_tokens: usize,
    max_tokens: usize,
    out_ticket: *mut u64,
) -> Res<()> {
    // SAFETY: the caller guarantees tokens[0..n_tokens] is readable (or NULL).
    let tk = unsafe { input(tokens, n_tokens, "tokens", "n_tokens") }?;
    check_out(out_ticket, "out_ticket")?;
    let ticket = d.cache.load_back(ns, tk, max_tokens).map_err(|e| match e {
        Error::NoTier => {
            bad(format!("this {} has no host tier (create it with rkv_cache_new_host)", d.noun))
        }
        e => st(e),
    })?;
    lk(&d.loads.tickets).insert(ticket.0);
    // SAFETY: passed `check_out`; writable by the caller's contract.
    unsafe { out_ticket.write(ticket.0) };
    Ok(())
}

/// Hands a finished load-back to the caller: its lock into the table, its slots into the
/// buffer; parks it (for the next call) when the buffer is too small.
///
/// # Safety
/// `out_slots` passed `check_out_array(out_slots, out_cap)`, `out_result` and `out_len`
/// passed `check_out`, all writable.
#[allow(clippy::too_many_arguments)]
unsafe fn hand_over(
    d: Door<'_>,
    ticket: u64,
    l: Loaded,
    handle: Reserved<'_, PrefixLock>,
    out_slots: *mut u32,
    out_cap: usize,
    out_len: *mut usize,
    out_result: *mut rkv_load_result,
) -> Res<()> {
    let n = l.slots.len();
    if n > out_cap {
        lk(&d.loads.parked).insert(ticket, l);
        // SAFETY: `out_len` passed `check_out`; writable by the caller's contract.
        unsafe { out_len.write(n) };
        return Err(too_small_slots(
            out_cap,
            n,
            "; the result is kept: call again with a larger buffer (out_cap = n_tokens of the \
             load-back always suffices)",
        ));
    }
    lk(&d.loads.tickets).remove(&ticket);
    let r = rkv_load_result {
        lock: 0,
        len: l.lock.len(),
        device_len: l.device_len,
        loaded: l.loaded,
        outcome: c_outcome(l.outcome) as u32,
        reserved: 0,
    };
    let slots = l.slots;
    let r = rkv_load_result { lock: handle.fill(l.lock), ..r };
    // SAFETY: the caller's contract; `out_cap >= n`.
    unsafe {
        write_array(out_slots, &slots);
        out_len.write(n);
        out_result.write(r);
    }
    Ok(())
}

/// The ticket's refusal when it is not outstanding.
fn unknown_ticket(ticket: u64) -> crate::Fail {
    bad(format!(
        "load-back ticket {ticket} is unknown or its result was taken already (a result is \
         taken once)"
    ))
}

/// The common part of `rkv_tier_load_poll`, `rkv_tier_load_wait` and their `rkv_cache_*`
/// twins on `d`: checks, then the parked result if any, else `take` (the core's
/// `try_load` or `wait_load`).
///
/// # Safety
/// The outputs NULL or writable (`out_slots` for `out_cap`).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn take_load(
    d: Door<'_>,
    ticket: u64,
    out_slots: *mut u32,
    out_cap: usize,
    out_len: *mut usize,
    out_result: *mut rkv_load_result,
    out_done: Option<*mut c_int>,
    take: impl FnOnce(&Cache, LoadTicket) -> Option<Result<Loaded>>,
) -> Res<()> {
    check_out_array(out_slots, out_cap, "out_slots", "out_cap")?;
    check_out(out_len, "out_len")?;
    check_out(out_result, "out_result")?;
    if let Some(d) = out_done {
        check_out(d, "out_done")?;
    }
    if !lk(&d.loads.tickets).contains(&ticket) {
        return Err(unknown_ticket(ticket));
    }
    let handle = reserve_in(d)?;
    let parked = lk(&d.loads.parked).remove(&ticket);
    let got = match parked {
        Some(l) => Some(Ok(l)),
        None => take(d.cache, LoadTicket(ticket)),
    };
    match got {
        None => {
            if let Some(d) = out_done {
                // SAFETY: passed `check_out`; writable by the caller's contract.
                unsafe { d.write(0) };
            }
            Ok(())
        }
        Some(Err(e)) => {
            lk(&d.loads.tickets).remove(&ticket);
            Err(fail(rkv_status::from(&e), format!("load-back ticket {ticket}: {e}")))
        }
        Some(Ok(l)) => {
            // SAFETY: the outputs passed their checks and are writable by contract.
            unsafe { hand_over(d, ticket, l, handle, out_slots, out_cap, out_len, out_result) }?;
            if let Some(d) = out_done {
                // SAFETY: passed `check_out`; writable by the caller's contract.
                unsafe { d.write(1) };
            }
            Ok(())
        }
    }
}

/// Whether load-back `ticket` is done, without blocking (finishing the copies that are):
/// `RKV_OK` with `*out_done = 0` while its copy runs (nothing else written), or with
/// `*out_done = 1` and the result: `*out_result` (its lock is the caller's), the slots of
/// the locked prefix in `out_slots[0..*out_len]`. If those do not fit `out_cap`,
/// `RKV_BUFFER_TOO_SMALL` with only `*out_len` written and the result kept for the next
/// call (`out_cap = n_tokens` of the load-back always suffices). A failed copy is
/// `RKV_DEVICE_ERROR`, everything rolled back and the ticket spent. An unknown or taken
/// ticket is `RKV_INVALID_ARGUMENT`. All outputs required (`out_slots` may be NULL when
/// `out_cap == 0`). Thread-safe (one caller takes a ticket's result).
///
/// # Safety
/// `tier` is NULL or live; `out_slots[0..out_cap]` writable (or NULL); the other outputs
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_load_poll(
    tier: *const rkv_tier,
    ticket: u64,
    out_slots: *mut u32,
    out_cap: usize,
    out_len: *mut usize,
    out_result: *mut rkv_load_result,
    out_done: *mut c_int,
) -> rkv_status {
    boundary("rkv_tier_load_poll", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        // SAFETY: the caller's contract is `take_load`'s.
        unsafe {
            take_load(
                t.door(),
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

/// `rkv_tier_load_poll` that blocks until the load-back is done (no `out_done`): `RKV_OK`
/// with the result, `RKV_BUFFER_TOO_SMALL` (result kept), `RKV_DEVICE_ERROR` for a failed
/// copy (rolled back, ticket spent), `RKV_INVALID_ARGUMENT` for an unknown or taken ticket.
/// Thread-safe.
///
/// # Safety
/// As `rkv_tier_load_poll`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_load_wait(
    tier: *const rkv_tier,
    ticket: u64,
    out_slots: *mut u32,
    out_cap: usize,
    out_len: *mut usize,
    out_result: *mut rkv_load_result,
) -> rkv_status {
    boundary("rkv_tier_load_wait", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        // SAFETY: the caller's contract is `take_load`'s.
        unsafe {
            take_load(t.door(), ticket, out_slots, out_cap, out_len, out_result, None, |c, t| {
                Some(c.wait_load(t))
            })
        }
    })
}
