//! Progress of copies in flight, statistics and the invariant check.

use super::*;

// ---------------------------------------------------------------------------------------
// Progress, stats, invariants.

/// Finishes the copies that are done (backups commit their host copies and unpin their
/// device pages; load-backs insert their pages) and writes how many finished to
/// `*out_finished` (required). Every `rkv_tier_*` call does this too; an engine calls it
/// once per scheduler step. Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `out_finished` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_poll(
    tier: *const rkv_tier,
    out_finished: *mut usize,
) -> rkv_status {
    boundary("rkv_tier_poll", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        check_out(out_finished, "out_finished")?;
        let n = t.cache.poll();
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_finished.write(n) };
        Ok(())
    })
}

/// Waits for every copy in flight and finishes it (failed copies are rolled back and
/// counted; a failed load-back's ticket then reports `RKV_DEVICE_ERROR`). Thread-safe.
///
/// # Safety
/// `tier` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_wait_all(tier: *const rkv_tier) -> rkv_status {
    boundary("rkv_tier_wait_all", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        t.cache.wait_all();
        Ok(())
    })
}

/// Writes the tier's counts and counters to `*out_stats` (required, owned by the caller).
/// Thread-safe.
///
/// # Safety
/// `tier` is NULL or live; `out_stats` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_get_stats(
    tier: *const rkv_tier,
    out_stats: *mut rkv_tier_stats,
) -> rkv_status {
    boundary("rkv_tier_get_stats", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        check_out(out_stats, "out_stats")?;
        let s = tier_stats(&t.cache);
        let c = c_tier_stats(&s);
        // SAFETY: passed `check_out`; writable by the caller's contract.
        unsafe { out_stats.write(c) };
        Ok(())
    })
}

/// Checks the tier's invariants at quiescence (device `free + cached + held == pool_slots`,
/// host `free + backed == host_slots`, every host page owned once or free, every resident
/// host entry naming a cached device page of its identity, nothing still writing or
/// pinned): `RKV_OK` when they hold; `RKV_INVALID_ARGUMENT` while copies are in flight (call
/// `rkv_tier_wait_all` first); `RKV_INTERNAL_ERROR` for a violation (a bug). The message
/// (`rkv_last_error_message()`) says which. Call it with no other call on the tier running.
/// For tests and debugging: it walks the whole pool.
///
/// # Safety
/// `tier` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rkv_tier_check(tier: *const rkv_tier) -> rkv_status {
    boundary("rkv_tier_check", || {
        // SAFETY: the caller passes NULL or a live tier that is not being freed.
        let t = unsafe { tier_ref(tier) }?;
        let in_flight = tier_stats(&t.cache).in_flight;
        if in_flight > 0 {
            return Err(bad(format!(
                "{in_flight} copies are in flight: call rkv_tier_wait_all first"
            )));
        }
        tier_check(&t.cache).map_err(|m| {
            fail(rkv_status::RKV_INTERNAL_ERROR, format!("invariant violated (a bug): {m}"))
        })
    })
}

/// The C form of the core's tier statistics.
pub(super) fn c_tier_stats(s: &TierStats) -> rkv_tier_stats {
    rkv_tier_stats {
        device: to_c_stats(&s.device),
        host_slots: s.host_slots,
        host_free_slots: s.host_free_slots,
        host_backed_slots: s.host_backed_slots,
        host_resident_pages: s.host_resident_pages,
        host_pinned_pages: s.host_pinned_pages,
        host_evictable_pages: s.host_evictable_pages,
        device_hit_tokens: s.device_hit_tokens,
        host_hit_tokens: s.host_hit_tokens,
        tokens_to_host: s.tokens_to_host,
        tokens_written_back: s.tokens_written_back,
        tokens_to_device: s.tokens_to_device,
        copies_to_host: s.copies_to_host,
        copies_to_device: s.copies_to_device,
        copy_failures: s.copy_failures,
        load_backs: s.load_backs,
        load_backs_skipped: s.load_backs_skipped,
        host_evicted_pages: s.host_evicted_pages,
        in_flight: s.in_flight,
    }
}
