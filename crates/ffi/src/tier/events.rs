//! The tier's KV events: enable, flush, drain.

use super::*;

// ---------------------------------------------------------------------------------------
// Events.

/// The refusal of a tier without events.
fn no_events() -> crate::Fail {
    bad("events are not enabled on this tier (call rkv_tier_events_enable right after \
         rkv_tier_new)"
        .into())
}

/// Turns KV events on for the tier (as `rkv_events_enable` for a cache, `*opts` required):
/// device pages are published with `opts->medium`, host copies with `RKV_MEDIUM_CPU_PINNED`
/// (`BLOCK_STORED` when a copy becomes ready, `BLOCK_REMOVED` when host eviction drops it).
/// Only once, while the tier is empty (right after `rkv_tier_new`): `RKV_INVALID_ARGUMENT`
/// otherwise and for bad options. Take the events with `rkv_tier_events_flush` and
/// `rkv_tier_events_drain`. Not thread-safe: no other call on the tier may run concurrently
/// (hence `rkv_tier *`).
///
/// # Safety
/// `tier` is NULL or live and used by no other call meanwhile; `opts` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_events_enable(
    tier: *mut rkv_tier,
    opts: *const rkv_events_options,
) -> rkv_status {
    boundary("rkv_tier_events_enable", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        unsafe { tier_ref(tier) }?;
        // SAFETY: non-null, aligned, live (checked above) and, by the caller's contract,
        // used by nothing else during the call: the only reference.
        let t = unsafe { &mut *tier };
        // SAFETY: the caller passes NULL or a readable `rkv_events_options`.
        let eo = unsafe { event_options(opts) }?;
        let dev = &t.cache;
        if dev.events().is_some() {
            return Err(bad("events are enabled on this tier already (enable them once)".into()));
        }
        let s = dev.stats();
        if s.tree.nodes != 0
            || dev.tree().namespace_count() != 0
            || tier_stats(&t.cache).host_backed_slots != 0
        {
            return Err(bad(format!(
                "the tier is not empty ({} tokens cached): enable events right after \
                 rkv_tier_new, before the first insert",
                s.tree.cached_tokens
            )));
        }
        t.cache.enable_events(eo).map_err(st)?;
        Ok(())
    })
}

/// Closes the tier's events recorded so far into one batch, as `rkv_events_flush`:
/// `*out_seq` (required) gets its number, or `RKV_EVENTS_NO_SEQ` when there were none.
/// `RKV_INVALID_ARGUMENT` for a tier without events. Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `out_seq` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_events_flush(
    tier: *const rkv_tier,
    out_seq: *mut u64,
) -> rkv_status {
    boundary("rkv_tier_events_flush", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        check_out(out_seq, "out_seq")?;
        let s = t.cache.events().ok_or_else(no_events)?;
        let seq = s.flush().unwrap_or(crate::RKV_EVENTS_NO_SEQ);
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_seq.write(seq) };
        Ok(())
    })
}

/// Drains the tier's closed event batches into the caller's buffers, exactly as
/// `rkv_events_drain` does for a cache (same buffers, same `*out_info`, same
/// `RKV_BUFFER_TOO_SMALL` protocol); `RKV_INVALID_ARGUMENT` for a tier without events.
/// Thread-safe.
///
/// # Safety
/// As `rkv_events_drain`, with `tier` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_events_drain(
    tier: *const rkv_tier,
    out_events: *mut rkv_event,
    events_cap: usize,
    out_hashes: *mut u64,
    hashes_cap: usize,
    out_tokens: *mut u32,
    tokens_cap: usize,
    out_strings: *mut c_char,
    strings_cap: usize,
    out_info: *mut rkv_events_drain_info,
) -> rkv_status {
    boundary("rkv_tier_events_drain", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        // SAFETY: the caller's contract for the buffers and `out_info` is `drain_into`'s.
        unsafe {
            drain_into(
                || t.cache.events().ok_or_else(no_events),
                out_events,
                events_cap,
                out_hashes,
                hashes_cap,
                out_tokens,
                tokens_cap,
                out_strings,
                strings_cap,
                out_info,
            )
        }
    })
}
