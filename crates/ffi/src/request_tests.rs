//! The request cycle through the C ABI: the whole cycle, every bad input, no slot lost,
//! and `rkv_cache_free` with live requests.

use super::*;

use std::ptr::{null, null_mut};

fn pool_cache(page_size: usize, pool: usize) -> *mut rkv_cache {
    let mut o = rkv_options_default();
    o.page_size = page_size as _;
    o.pool_slots = pool as _;
    let mut c = null_mut();
    // SAFETY: `o` and `c` are live locals.
    assert_eq!(unsafe { rkv_cache_new(&o, &mut c) }, rkv_status::RKV_OK);
    c
}

fn free_slots(c: *const rkv_cache) -> u64 {
    let mut s = rkv_stats::default();
    // SAFETY: `c` is live, `s` a local.
    assert_eq!(unsafe { rkv_cache_stats(c, &mut s) }, rkv_status::RKV_OK);
    s.free_slots
}

fn info(r: *const rkv_request) -> rkv_request_info {
    let mut i = rkv_request_info::default();
    // SAFETY: `r` is a live request, `i` a local.
    assert_eq!(unsafe { rkv_request_info_get(r, &mut i) }, rkv_status::RKV_OK);
    i
}

fn slots(r: *const rkv_request) -> Vec<u32> {
    let mut n = 0usize;
    // SAFETY: `r` is live; cap 0 with NULL asks for the length only.
    assert_eq!(unsafe { rkv_request_slots(r, null_mut(), 0, &mut n) }, rkv_status::RKV_OK);
    let mut v = vec![0u32; n];
    // SAFETY: `v` holds `n` slots.
    assert_eq!(unsafe { rkv_request_slots(r, v.as_mut_ptr(), n, &mut n) }, rkv_status::RKV_OK);
    v
}

#[test]
fn the_whole_cycle_reuses_the_finished_prefix() {
    let c = pool_cache(4, 64);
    let start = free_slots(c);
    let prompt: Vec<u32> = (0..10).collect();
    // SAFETY: every pointer is a live local or a live handle of the stated length.
    unsafe {
        let mut r = null_mut();
        assert_eq!(
            rkv_request_admit(c, 7, prompt.as_ptr(), prompt.len(), 3, &mut r),
            rkv_status::RKV_OK
        );
        let i = info(r);
        assert_eq!((i.len, i.cached_len, i.locked_len, i.ns), (10, 0, 0, 7));
        assert_eq!(slots(r).len(), 10);
        assert_eq!(free_slots(c), start - 12); // three whole pages
        let mut e = 99;
        assert_eq!(rkv_request_checkpoint(r, &mut e), rkv_status::RKV_OK);
        assert_eq!((e, info(r).locked_len), (0, 8));
        assert_eq!(rkv_request_extend(r, [10, 11, 12].as_ptr(), 3), rkv_status::RKV_OK);
        assert_eq!(rkv_request_extend(r, null(), 0), rkv_status::RKV_OK);
        assert_eq!(info(r).len, 13);
        assert_eq!(rkv_request_finish(r, &mut e), rkv_status::RKV_OK);
        assert_eq!(e, 8);

        // The same prompt again: 8 tokens (two pages) cached; abort gives everything back.
        let mut r2 = null_mut();
        assert_eq!(
            rkv_request_admit(c, 7, prompt.as_ptr(), prompt.len(), 0, &mut r2),
            rkv_status::RKV_OK
        );
        assert_eq!(info(r2).cached_len, 8);
        assert_eq!(info(r2).locked_len, 8);
        // Another namespace shares nothing.
        let mut r3 = null_mut();
        assert_eq!(
            rkv_request_admit(c, 8, prompt.as_ptr(), prompt.len(), 0, &mut r3),
            rkv_status::RKV_OK
        );
        assert_eq!(info(r3).cached_len, 0);
        rkv_request_abort(r3);
        rkv_request_abort(r2);
        rkv_request_abort(null_mut());
        // What is cached (12 tokens of 3 pages) is out of the pool; nothing else is.
        let mut s = rkv_stats::default();
        assert_eq!(rkv_cache_stats(c, &mut s), rkv_status::RKV_OK);
        assert_eq!(s.protected_tokens, 0);
        assert_eq!(s.free_slots + s.cached_tokens, start);
        assert_eq!(rkv_cache_reset(c), rkv_status::RKV_OK);
        assert_eq!(free_slots(c), start);
        rkv_cache_free(c);
    }
}

#[test]
fn every_bad_input_is_refused_and_changes_nothing() {
    let c = pool_cache(1, 16);
    let start = free_slots(c);
    let t = [1u32, 2, 3];
    // SAFETY: every pointer is NULL, a live local or a live handle of the stated length.
    unsafe {
        let mut r = null_mut();
        use rkv_status::*;
        assert_eq!(rkv_request_admit(null(), 0, t.as_ptr(), 3, 0, &mut r), RKV_NULL_ARGUMENT);
        assert_eq!(rkv_request_admit(c, 0, null(), 3, 0, &mut r), RKV_NULL_ARGUMENT);
        assert_eq!(rkv_request_admit(c, 0, t.as_ptr(), 3, 0, null_mut()), RKV_NULL_ARGUMENT);
        assert_eq!(rkv_request_admit(c, 0, t.as_ptr(), 3, 1 << 40, &mut r), RKV_INVALID_ARGUMENT);
        // More than the pool holds: nothing held.
        let long: Vec<u32> = (0..17).collect();
        assert_eq!(rkv_request_admit(c, 0, long.as_ptr(), 17, 0, &mut r), RKV_OUT_OF_SLOTS);
        assert!(r.is_null());
        assert_eq!(free_slots(c), start);
        // Without a pool.
        let np = pool_cache(1, 0);
        assert_eq!(rkv_request_admit(np, 0, t.as_ptr(), 3, 0, &mut r), RKV_NO_POOL);
        rkv_cache_free(np);

        // An empty prompt is a request of 0 tokens.
        assert_eq!(rkv_request_admit(c, 0, null(), 0, 0, &mut r), RKV_OK);
        assert_eq!(info(r).len, 0);
        assert_eq!(rkv_request_extend(r, t.as_ptr(), 3), RKV_OK);

        assert_eq!(rkv_request_extend(null_mut(), t.as_ptr(), 3), RKV_NULL_ARGUMENT);
        assert_eq!(rkv_request_extend(r, null(), 1), RKV_NULL_ARGUMENT);
        assert_eq!(rkv_request_extend(r, long.as_ptr(), 17), RKV_OUT_OF_SLOTS);
        assert_eq!(info(r).len, 3);
        let mut n = 0usize;
        assert_eq!(rkv_request_checkpoint(null_mut(), &mut n), RKV_NULL_ARGUMENT);
        assert_eq!(rkv_request_checkpoint(r, null_mut()), RKV_NULL_ARGUMENT);
        let mut i = rkv_request_info::default();
        assert_eq!(rkv_request_info_get(null(), &mut i), RKV_NULL_ARGUMENT);
        assert_eq!(rkv_request_info_get(r, null_mut()), RKV_NULL_ARGUMENT);
        let mut buf = [0u32; 2];
        assert_eq!(rkv_request_slots(null(), buf.as_mut_ptr(), 2, &mut n), RKV_NULL_ARGUMENT);
        assert_eq!(rkv_request_slots(r, null_mut(), 2, &mut n), RKV_NULL_ARGUMENT);
        assert_eq!(rkv_request_slots(r, buf.as_mut_ptr(), 2, null_mut()), RKV_NULL_ARGUMENT);
        n = 0;
        assert_eq!(rkv_request_slots(r, buf.as_mut_ptr(), 2, &mut n), RKV_BUFFER_TOO_SMALL);
        assert_eq!((n, buf), (3, [0, 0]));
        let misaligned = (r as usize + 1) as *mut rkv_request;
        assert_eq!(rkv_request_extend(misaligned, t.as_ptr(), 3), RKV_INVALID_ARGUMENT);
        rkv_request_abort(misaligned); // refused quietly: not a handle
        // finish with a NULL output keeps the handle; then it finishes.
        assert_eq!(rkv_request_finish(null_mut(), &mut n), RKV_NULL_ARGUMENT);
        assert_eq!(rkv_request_finish(r, null_mut()), RKV_NULL_ARGUMENT);
        assert_eq!(rkv_request_finish(r, &mut n), RKV_OK);
        assert_eq!(n, 0);
        // r is consumed: a second finish is impossible (the pointer is gone).
        assert_eq!(rkv_cache_reset(c), RKV_OK);
        assert_eq!(free_slots(c), start);
        rkv_cache_free(c);
    }
}

#[test]
fn freeing_the_cache_aborts_live_requests() {
    let c = pool_cache(2, 32);
    let t: Vec<u32> = (0..9).collect();
    // SAFETY: every pointer is a live local or handle; after the free, the requests are
    // touched only through their own handles, as the contract allows.
    unsafe {
        let (mut a, mut b, mut d) = (null_mut(), null_mut(), null_mut());
        assert_eq!(rkv_request_admit(c, 1, t.as_ptr(), 9, 0, &mut a), rkv_status::RKV_OK);
        assert_eq!(rkv_request_admit(c, 1, t.as_ptr(), 9, 0, &mut b), rkv_status::RKV_OK);
        assert_eq!(rkv_request_admit(c, 1, t.as_ptr(), 9, 0, &mut d), rkv_status::RKV_OK);
        let mut n = 0;
        assert_eq!(rkv_request_checkpoint(a, &mut n), rkv_status::RKV_OK);
        rkv_cache_free(c);
        let mut i = rkv_request_info::default();
        assert_eq!(rkv_request_info_get(a, &mut i), rkv_status::RKV_INVALID_ARGUMENT);
        assert!(
            std::ffi::CStr::from_ptr(rkv_last_error_message())
                .to_str()
                .unwrap()
                .contains("cache was freed")
        );
        assert_eq!(rkv_request_extend(a, t.as_ptr(), 1), rkv_status::RKV_INVALID_ARGUMENT);
        assert_eq!(rkv_request_checkpoint(a, &mut n), rkv_status::RKV_INVALID_ARGUMENT);
        assert_eq!(rkv_request_finish(b, &mut n), rkv_status::RKV_INVALID_ARGUMENT); // freed
        rkv_request_abort(a);
        rkv_request_abort(d);
    }
}

#[test]
fn requests_run_on_many_threads() {
    let c = pool_cache(4, 4096) as usize;
    std::thread::scope(|s| {
        for th in 0..4u32 {
            s.spawn(move || {
                let c = c as *const rkv_cache;
                for k in 0..50u32 {
                    let t: Vec<u32> = (0..20).map(|x| x + (k % 5) * 100).collect();
                    // SAFETY: `c` is live for the scope; every pointer is a live local.
                    unsafe {
                        let mut r = null_mut();
                        assert_eq!(
                            rkv_request_admit(c, 0, t.as_ptr(), t.len(), 0, &mut r),
                            rkv_status::RKV_OK
                        );
                        assert_eq!(rkv_request_extend(r, [th, k].as_ptr(), 2), rkv_status::RKV_OK);
                        let mut n = 0;
                        if k % 3 == 0 {
                            rkv_request_abort(r);
                        } else {
                            assert_eq!(rkv_request_finish(r, &mut n), rkv_status::RKV_OK);
                        }
                    }
                }
            });
        }
    });
    let c = c as *mut rkv_cache;
    // SAFETY: `c` is live and no other thread uses it now.
    unsafe {
        assert_eq!(rkv_cache_reset(c), rkv_status::RKV_OK);
        assert_eq!(free_slots(c), 4096);
        rkv_cache_free(c);
    }
}
