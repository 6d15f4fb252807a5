//! The sliding-window component through the C ABI: `rkv_policy_options.swa_window`, SWA-valid
//! matches, window locks, `rkv_evict_kv` and its refusals, the old 8-byte policy struct.

use std::ffi::c_void;
use std::ptr::null_mut;

use crate::*;

/// What `rkv_evict_kv` reported: (freed bits, slots) per node.
type Got = Vec<(u32, Vec<u32>)>;

unsafe extern "C" fn record(ctx: *mut c_void, freed: u32, slots: *const u32, n: usize) {
    // SAFETY: `ctx` is the test's live `Got`; `slots[..n]` is valid during the call.
    unsafe { (*ctx.cast::<Got>()).push((freed, std::slice::from_raw_parts(slots, n).to_vec())) }
}

/// A pool-mode cache of 16 slots with window `w`.
fn window_cache(w: u32) -> *mut rkv_cache {
    let o = rkv_options { pool_slots: 16, ..rkv_options_default() };
    let p = rkv_policy_options { swa_window: w, ..rkv_policy_options_default() };
    let mut c = null_mut();
    // SAFETY: live locals.
    assert_eq!(unsafe { rkv_cache_new_with(&o, &p, &mut c) }, rkv_status::RKV_OK);
    c
}

#[test]
fn a_window_cache_matches_valid_prefixes_and_evicts_through_evict_kv() {
    let c = window_cache(2);
    let (mut n, mut lock) = (0usize, 0 as rkv_lock);
    let mut slots = [0u32; 16];
    let mut out = [0u32; 16];
    let mut got: Got = Vec::new();
    let ctx = (&mut got as *mut Got).cast::<c_void>();
    // SAFETY: every pointer is a live local or NULL where allowed; `c` is live.
    unsafe {
        assert_eq!(rkv_alloc(c, 6, slots.as_mut_ptr()), rkv_status::RKV_OK);
        let a = [1u32, 2, 3, 4];
        let b = [1u32, 2, 3, 4, 5, 6];
        assert_eq!(rkv_insert(c, 0, a.as_ptr(), slots.as_ptr(), 4, &mut n), rkv_status::RKV_OK);
        let bs = [slots[0], slots[1], slots[2], slots[3], slots[4], slots[5]];
        assert_eq!(rkv_insert(c, 0, b.as_ptr(), bs.as_ptr(), 6, &mut n), rkv_status::RKV_OK);
        assert_eq!(n, 4);
        // Hold [5, 6]'s window: [1..4] is then the only SWA candidate.
        let st = rkv_match_lock(c, 0, b.as_ptr(), 6, out.as_mut_ptr(), 16, &mut n, &mut lock);
        assert_eq!((st, n), (rkv_status::RKV_OK, 6));
        // Refusals change nothing: no callback, an unknown target.
        let r = rkv_evict_kv(c, 1, 4, None, null_mut(), &mut n);
        assert_eq!(r, rkv_status::RKV_NULL_ARGUMENT);
        let r = rkv_evict_kv(c, 7, 4, Some(record), ctx, &mut n);
        assert_eq!(r, rkv_status::RKV_INVALID_ARGUMENT);
        assert_eq!(rkv_evict(c, 4, None, null_mut(), &mut n), rkv_status::RKV_INVALID_ARGUMENT);
        assert!(got.is_empty());
        // The tombstone: [1..4]'s SWA KV only.
        let r = rkv_evict_kv(
            c,
            rkv_evict_target::RKV_EVICT_TARGET_SWA as u32,
            1,
            Some(record),
            ctx,
            &mut n,
        );
        assert_eq!((r, n), (rkv_status::RKV_OK, 4));
        assert_eq!(got, vec![(RKV_FREED_SWA, slots[..4].to_vec())]);
        // A match ending on it is not valid; one 2 tokens past it is.
        assert_eq!(
            rkv_match(c, 0, a.as_ptr(), 4, out.as_mut_ptr(), 16, &mut n),
            rkv_status::RKV_OK
        );
        assert_eq!(n, 0);
        assert_eq!(
            rkv_match(c, 0, b.as_ptr(), 6, out.as_mut_ptr(), 16, &mut n),
            rkv_status::RKV_OK
        );
        assert_eq!(n, 6);
        assert_eq!(rkv_release(c, lock), rkv_status::RKV_OK);
        got.clear();
        let r = rkv_evict_kv(
            c,
            rkv_evict_target::RKV_EVICT_TARGET_FULL as u32,
            16,
            Some(record),
            ctx,
            &mut n,
        );
        assert_eq!((r, n), (rkv_status::RKV_OK, 6));
        assert_eq!(
            got,
            vec![
                (RKV_FREED_FULL | RKV_FREED_SWA, slots[4..6].to_vec()),
                (RKV_FREED_FULL, slots[..4].to_vec())
            ]
        );
        // The full KV went back to the pool.
        assert_eq!(rkv_alloc(c, 16, slots.as_mut_ptr()), rkv_status::RKV_OK);
        rkv_cache_free(c);
    }
}

#[test]
fn the_policy_struct_from_before_swa_window_is_read_as_8_bytes() {
    // A caller built against the 8-byte struct: only `size` and `slru_threshold` exist.
    let old: [u32; 2] = [8, 5];
    let o = rkv_options {
        eviction_policy: rkv_eviction_policy::RKV_EVICT_SLRU as u32,
        ..rkv_options_default()
    };
    let mut c = null_mut();
    let (mut pol, mut thr) = (0u32, 0u32);
    // SAFETY: `old` is a live, aligned 8-byte prefix of an rkv_policy_options, as the
    // header of that version laid it out; the rest are live locals.
    unsafe {
        let p = old.as_ptr().cast::<rkv_policy_options>();
        assert_eq!(rkv_cache_new_with(&o, p, &mut c), rkv_status::RKV_OK);
        assert_eq!(rkv_cache_eviction_policy(c, &mut pol, &mut thr), rkv_status::RKV_OK);
        assert_eq!((pol, thr), (6, 5));
        assert_eq!(c.as_ref().unwrap().cache.options().swa_window, 0);
        rkv_cache_free(c);
    }
}
