//! `rkv_match_ex` and the host tier through a plain `rkv_cache` (`rkv_cache_load_back`,
//! `rkv_cache_load_poll`, `rkv_cache_load_wait`, `rkv_cache_evict_host`): the results, and
//! every bad input refused with its status and message, no output written, nothing changed.

use super::*;

use std::ffi::{CStr, c_int};
use std::ptr::{null, null_mut};

fn last() -> String {
    // SAFETY: `rkv_last_error_message` returns a NUL-terminated string, never NULL, valid
    // until the next status-returning call on this thread (it is copied at once).
    unsafe { CStr::from_ptr(rkv_last_error_message()) }.to_str().unwrap().to_owned()
}

#[track_caller]
fn check(got: rkv_status, want: rkv_status, needles: &[&str]) {
    let m = last();
    assert_eq!(got, want, "message: {m}");
    for n in needles {
        assert!(m.contains(n), "{m:?} lacks {n:?}");
    }
}

fn plain_cache(pool_slots: u64) -> *mut rkv_cache {
    let o = rkv_options { page_size: 4, pool_slots, ..rkv_options_default() };
    let mut c = null_mut();
    // SAFETY: both pointers point to live locals.
    assert_eq!(unsafe { rkv_cache_new(&o, &mut c) }, rkv_status::RKV_OK);
    c
}

/// A cache of page 4 with a pool of `dev` slots and a write-through host tier of `host`.
fn host_cache(dev: u64, host: u64) -> *mut rkv_cache {
    let o = rkv_options { page_size: 4, pool_slots: dev, ..rkv_options_default() };
    let t = rkv_tier_options {
        host_slots: host,
        write_policy: rkv_write_policy::RKV_WRITE_THROUGH as u32,
        ..rkv_tier_options_default()
    };
    let mut c = null_mut();
    // SAFETY: the pointers are NULL or point to live locals.
    assert_eq!(unsafe { rkv_cache_new_host(&o, null(), &t, &mut c) }, rkv_status::RKV_OK);
    c
}

fn stats(c: *const rkv_cache) -> rkv_stats {
    let mut s = rkv_stats::default();
    // SAFETY: `c` is live; `s` is a live local.
    assert_eq!(unsafe { rkv_cache_stats(c, &mut s) }, rkv_status::RKV_OK);
    s
}

fn tier_stats(c: *const rkv_cache) -> rkv_tier_stats {
    let mut s = rkv_tier_stats::default();
    // SAFETY: `c` is live; `s` is a live local.
    assert_eq!(unsafe { rkv_cache_tier_stats(c, &mut s) }, rkv_status::RKV_OK);
    s
}

/// Allocates and inserts `tokens` into `c` (a pool cache).
fn insert(c: *const rkv_cache, tokens: &[u32]) {
    let mut slots = vec![0u32; tokens.len()];
    let mut e = 0usize;
    // SAFETY: `c` is live; the buffers hold `tokens.len()` values.
    unsafe {
        assert_eq!(rkv_alloc(c, tokens.len(), slots.as_mut_ptr()), rkv_status::RKV_OK);
        let st = rkv_insert(c, 0, tokens.as_ptr(), slots.as_ptr(), tokens.len(), &mut e);
        assert_eq!(st, rkv_status::RKV_OK, "{}", last());
    }
}

fn match_ex(c: *const rkv_cache, tokens: &[u32], flags: u32) -> (rkv_match_result, Vec<u32>) {
    let o = rkv_match_options { flags, ..rkv_match_options_default() };
    let mut out = vec![0u32; tokens.len()];
    let mut r = rkv_match_result::default();
    // SAFETY: `c` is live; the buffers are live locals of the lengths passed.
    let st = unsafe {
        rkv_match_ex(c, 0, tokens.as_ptr(), tokens.len(), &o, out.as_mut_ptr(), out.len(), &mut r)
    };
    assert_eq!(st, rkv_status::RKV_OK, "{}", last());
    out.truncate(r.device_len);
    (r, out)
}

const SENTINEL: rkv_match_result =
    rkv_match_result { device_len: 0xdead, host_len: 0xbeef, lock: 7 };

#[test]
fn match_ex_on_a_plain_cache_is_match_and_match_lock_with_host_len_zero() {
    let c = plain_cache(16);
    let a: Vec<u32> = (1..=8).collect();
    insert(c, &a);
    let mut q = a.clone();
    q.extend([99, 98]);
    let (r, slots) = match_ex(c, &q, 0);
    assert_eq!((r.device_len, r.host_len, r.lock), (8, 0, 0));
    let mut want = vec![0u32; 10];
    let mut n = 0usize;
    // SAFETY: `c` is live; the buffers are live locals of the lengths passed.
    unsafe {
        assert_eq!(
            rkv_match(c, 0, q.as_ptr(), 10, want.as_mut_ptr(), 10, &mut n),
            rkv_status::RKV_OK
        );
    }
    assert_eq!(slots, want[..n]);
    assert_eq!(stats(c).protected_tokens, 0, "a plain match pins nothing");
    let (r, _) = match_ex(c, &q, RKV_MATCH_LOCK);
    assert!(r.lock != 0 && r.device_len == 8 && r.host_len == 0);
    assert_eq!(stats(c).protected_tokens, 8);
    // SAFETY: `c` is live; the lock is its own.
    unsafe {
        assert_eq!(rkv_release(c, r.lock), rkv_status::RKV_OK);
        assert_eq!(rkv_release(c, r.lock), rkv_status::RKV_INVALID_LOCK);
    }
    assert_eq!(stats(c).protected_tokens, 0);
    // A lock over an empty match is a lock too.
    let (r, _) = match_ex(c, &[500, 501], RKV_MATCH_LOCK);
    assert!(r.lock != 0 && r.device_len == 0);
    // SAFETY: as above.
    assert_eq!(unsafe { rkv_release(c, r.lock) }, rkv_status::RKV_OK);
    // NULL options: a plain match; NULL out_slots with out_cap 0: the lengths alone.
    let mut r = SENTINEL;
    // SAFETY: `c` is live; `q` holds 10 tokens; `r` is a live local.
    unsafe {
        assert_eq!(
            rkv_match_ex(c, 0, q.as_ptr(), 10, null(), null_mut(), 0, &mut r),
            rkv_status::RKV_OK
        );
    }
    assert_eq!((r.device_len, r.host_len, r.lock), (8, 0, 0));
    // SAFETY: `c` was made here and is freed once.
    unsafe { rkv_cache_free(c) };
}

#[test]
fn match_ex_too_small_writes_the_length_alone_and_pins_nothing() {
    let c = plain_cache(16);
    let a: Vec<u32> = (1..=8).collect();
    insert(c, &a);
    let before = stats(c);
    let lock = rkv_match_options { flags: RKV_MATCH_LOCK, ..rkv_match_options_default() };
    for (opts, cap) in [(null(), 4usize), (&lock as *const _, 4), (&lock as *const _, 0)] {
        let mut out = [0u32; 4];
        let mut r = SENTINEL;
        let p = if cap == 0 { null_mut() } else { out.as_mut_ptr() };
        // SAFETY: `c` is live; `out` holds 4 slots (or is NULL with cap 0).
        let st = unsafe { rkv_match_ex(c, 0, a.as_ptr(), 8, opts, p, cap, &mut r) };
        check(
            st,
            rkv_status::RKV_BUFFER_TOO_SMALL,
            &["rkv_match_ex", "match of 8 tokens", "(out_result->device_len = 8)"],
        );
        assert_eq!((r.device_len, r.host_len, r.lock), (8, SENTINEL.host_len, SENTINEL.lock));
        assert_eq!(out, [0; 4], "no slot written");
    }
    let after = stats(c);
    assert_eq!(after.protected_tokens, 0, "nothing pinned");
    assert_eq!(after.match_calls, before.match_calls, "nothing counted");
    // SAFETY: `c` was made here and is freed once.
    unsafe { rkv_cache_free(c) };
}

#[test]
fn match_ex_refuses_every_bad_argument_writing_nothing() {
    let c = plain_cache(16);
    let a: Vec<u32> = (1..=8).collect();
    insert(c, &a);
    let before = stats(c);
    let mut buf = [0u64; 8];
    let mis_c = buf.as_mut_ptr().cast::<u8>().wrapping_add(1).cast::<rkv_cache>();
    let mut obuf = [0u64; 8];
    let mis_o = obuf.as_mut_ptr().cast::<u8>().wrapping_add(1).cast::<rkv_match_options>();
    let mut rbuf = [0u64; 8];
    let mis_r = rbuf.as_mut_ptr().cast::<u8>().wrapping_add(1).cast::<rkv_match_result>();
    let wrong_size = rkv_match_options { size: 4, ..rkv_match_options_default() };
    let bad_flag = rkv_match_options { flags: 2, ..rkv_match_options_default() };
    let mut out = [0u32; 8];
    let o = out.as_mut_ptr();
    let t = a.as_ptr();
    let mut r = SENTINEL;
    let rp: *mut rkv_match_result = &mut r;
    use rkv_status::*;
    // SAFETY: (for every call below) each pointer is NULL, misaligned (both refused
    // before any use), or a live local of the length passed.
    unsafe {
        let f = "rkv_match_ex: ";
        check(
            rkv_match_ex(null(), 0, t, 8, null(), o, 8, rp),
            RKV_NULL_ARGUMENT,
            &[f, "cache is NULL"],
        );
        check(
            rkv_match_ex(mis_c, 0, t, 8, null(), o, 8, rp),
            RKV_INVALID_ARGUMENT,
            &[f, "misaligned"],
        );
        check(
            rkv_match_ex(c, 0, null(), 8, null(), o, 8, rp),
            RKV_NULL_ARGUMENT,
            &[f, "tokens is NULL"],
        );
        check(
            rkv_match_ex(c, 0, t, 8, mis_o, o, 8, rp),
            RKV_INVALID_ARGUMENT,
            &[f, "opts = 0x", "aligned"],
        );
        check(
            rkv_match_ex(c, 0, t, 8, &wrong_size, o, 8, rp),
            RKV_INVALID_ARGUMENT,
            &[f, "opts->size = 4", "rkv_match_options_default"],
        );
        check(
            rkv_match_ex(c, 0, t, 8, &bad_flag, o, 8, rp),
            RKV_INVALID_ARGUMENT,
            &[f, "opts->flags = 0x2"],
        );
        check(
            rkv_match_ex(c, 0, t, 8, null(), null_mut(), 8, rp),
            RKV_NULL_ARGUMENT,
            &[f, "out_slots is NULL"],
        );
        check(
            rkv_match_ex(c, 0, t, 8, null(), o, 8, null_mut()),
            RKV_NULL_ARGUMENT,
            &[f, "out_result is NULL"],
        );
        check(
            rkv_match_ex(c, 0, t, 8, null(), o, 8, mis_r),
            RKV_INVALID_ARGUMENT,
            &[f, "out_result"],
        );
    }
    assert_eq!(
        (r.device_len, r.host_len, r.lock),
        (SENTINEL.device_len, SENTINEL.host_len, SENTINEL.lock)
    );
    assert_eq!(out, [0; 8]);
    let after = stats(c);
    assert_eq!((after.match_calls, after.protected_tokens), (before.match_calls, 0));
    // SAFETY: `c` was made here and is freed once.
    unsafe { rkv_cache_free(c) };
}

#[test]
fn a_host_tier_cache_reports_host_len_and_loads_back_through_rkv_cache() {
    let c = host_cache(16, 32);
    let a: Vec<u32> = (1..=8).collect();
    insert(c, &a);
    let mut n = 0usize;
    // SAFETY: `c` is live; the outputs are live locals.
    unsafe {
        assert_eq!(rkv_cache_wait_all(c), rkv_status::RKV_OK);
        assert_eq!(rkv_evict(c, 8, None, null_mut(), &mut n), rkv_status::RKV_OK);
    }
    assert_eq!(n, 8);
    let (r, slots) = match_ex(c, &a, 0);
    assert_eq!((r.device_len, r.host_len, slots.len()), (0, 8, 0));
    let (r, _) = match_ex(c, &a, RKV_MATCH_LOCK);
    assert_eq!((r.device_len, r.host_len), (0, 8));
    // SAFETY: `c` is live; the lock is its own.
    assert_eq!(unsafe { rkv_release(c, r.lock) }, rkv_status::RKV_OK);
    // Load back, taking the result with wait (a buffer too small first: the result stays).
    let mut ticket = 0u64;
    let mut out = [0u32; 8];
    let mut len = 0usize;
    let mut res = rkv_load_result::default();
    // SAFETY: `c` is live; the buffers are live locals of the lengths passed.
    unsafe {
        let st = rkv_cache_load_back(c, 0, a.as_ptr(), 8, usize::MAX, &mut ticket);
        assert_eq!(st, rkv_status::RKV_OK, "{}", last());
        let st = rkv_cache_load_wait(c, ticket, out.as_mut_ptr(), 4, &mut len, &mut res);
        check(st, rkv_status::RKV_BUFFER_TOO_SMALL, &["rkv_cache_load_wait", "the result is kept"]);
        assert_eq!((len, res), (8, rkv_load_result::default()));
        let st = rkv_cache_load_wait(c, ticket, out.as_mut_ptr(), 8, &mut len, &mut res);
        assert_eq!(st, rkv_status::RKV_OK, "{}", last());
    }
    assert_eq!((len, res.len, res.device_len, res.loaded), (8, 8, 0, 8));
    assert_eq!(res.outcome, rkv_load_outcome::RKV_LOAD_LOADED as u32);
    assert_eq!(stats(c).protected_tokens, 8, "the result's lock pins the loaded prefix");
    let (r, slots) = match_ex(c, &a, 0);
    assert_eq!((r.device_len, r.host_len), (8, 0));
    assert_eq!(slots, out);
    // SAFETY: `c` is live; the lock is its own (released by rkv_release, as any lock).
    unsafe {
        assert_eq!(rkv_release(c, res.lock), rkv_status::RKV_OK);
        // Taken: the ticket is spent.
        let st = rkv_cache_load_wait(c, ticket, out.as_mut_ptr(), 8, &mut len, &mut res);
        check(st, rkv_status::RKV_INVALID_ARGUMENT, &["load-back ticket", "taken already"]);
    }
    assert_eq!(stats(c).protected_tokens, 0);
    let ts = tier_stats(c);
    assert_eq!((ts.load_backs, ts.tokens_to_device), (1, 8));
    // Poll: evict again and load back with the non-blocking take.
    let mut done: c_int = 7;
    // SAFETY: as above.
    unsafe {
        assert_eq!(rkv_evict(c, 8, None, null_mut(), &mut n), rkv_status::RKV_OK);
        assert_eq!(rkv_cache_load_back(c, 0, a.as_ptr(), 8, 4, &mut ticket), rkv_status::RKV_OK);
        let st = rkv_cache_load_poll(c, ticket, out.as_mut_ptr(), 8, &mut len, &mut res, &mut done);
        assert_eq!(st, rkv_status::RKV_OK, "{}", last());
    }
    assert_eq!((done, len, res.loaded), (1, 4, 4), "the null copier is done at once");
    // SAFETY: as above.
    unsafe {
        assert_eq!(rkv_release(c, res.lock), rkv_status::RKV_OK);
        // Host eviction: the leaf still only on the host goes.
        assert_eq!(rkv_cache_evict_host(c, usize::MAX, &mut n), rkv_status::RKV_OK);
    }
    assert_eq!(n, 4);
    let (r, _) = match_ex(c, &a, 0);
    assert_eq!((r.device_len, r.host_len), (4, 0));
    // A ticket never taken and a result parked at free: released by rkv_cache_free.
    // SAFETY: as above; `c` is freed once, at the end.
    unsafe {
        let b: Vec<u32> = (50..58).collect();
        insert(c, &b);
        assert_eq!(rkv_cache_wait_all(c), rkv_status::RKV_OK);
        assert_eq!(rkv_evict(c, 64, None, null_mut(), &mut n), rkv_status::RKV_OK);
        let mut t2 = 0u64;
        assert_eq!(
            rkv_cache_load_back(c, 0, b.as_ptr(), 8, usize::MAX, &mut t2),
            rkv_status::RKV_OK
        );
        assert_eq!(
            rkv_cache_load_back(c, 0, a.as_ptr(), 8, usize::MAX, &mut ticket),
            rkv_status::RKV_OK
        );
        let st = rkv_cache_load_wait(c, ticket, out.as_mut_ptr(), 0, &mut len, &mut res);
        assert_eq!(st, rkv_status::RKV_BUFFER_TOO_SMALL);
        rkv_cache_free(c);
    }
}

#[test]
fn the_load_calls_refuse_every_bad_argument_and_a_cache_without_a_tier() {
    let c = host_cache(16, 32);
    let a: Vec<u32> = (1..=8).collect();
    insert(c, &a);
    let mut n = 0usize;
    // SAFETY: `c` is live; the outputs are live locals.
    unsafe {
        assert_eq!(rkv_cache_wait_all(c), rkv_status::RKV_OK);
        assert_eq!(rkv_evict(c, 8, None, null_mut(), &mut n), rkv_status::RKV_OK);
    }
    let plain = plain_cache(16);
    insert(plain, &a);
    let (before, tb) = (stats(c), tier_stats(c));
    let pb = stats(plain);
    let mut ticket = 0xdead_u64;
    let mut out = [0u32; 8];
    let o = out.as_mut_ptr();
    let mut len = 0xdead_usize;
    let mut res = rkv_load_result { lock: 0xfeed, ..Default::default() };
    let mut done: c_int = 7;
    let mut ev = 0xdead_usize;
    use rkv_status::*;
    // SAFETY: (for every call below) each pointer is NULL (refused before any use) or a
    // live local of the length passed; `c` and `plain` are live.
    unsafe {
        check(
            rkv_cache_load_back(null(), 0, a.as_ptr(), 8, 8, &mut ticket),
            RKV_NULL_ARGUMENT,
            &["rkv_cache_load_back: cache is NULL"],
        );
        check(
            rkv_cache_load_back(c, 0, null(), 8, 8, &mut ticket),
            RKV_NULL_ARGUMENT,
            &["tokens is NULL"],
        );
        check(
            rkv_cache_load_back(c, 0, a.as_ptr(), 8, 8, null_mut()),
            RKV_NULL_ARGUMENT,
            &["out_ticket is NULL"],
        );
        for (name, st) in [
            ("rkv_cache_load_back", rkv_cache_load_back(plain, 0, a.as_ptr(), 8, 8, &mut ticket)),
            (
                "rkv_cache_load_poll",
                rkv_cache_load_poll(plain, 1, o, 8, &mut len, &mut res, &mut done),
            ),
            ("rkv_cache_load_wait", rkv_cache_load_wait(plain, 1, o, 8, &mut len, &mut res)),
            ("rkv_cache_evict_host", rkv_cache_evict_host(plain, 8, &mut ev)),
        ] {
            assert_eq!(st, RKV_INVALID_ARGUMENT, "{name}");
        }
        check(
            rkv_cache_evict_host(plain, 8, &mut ev),
            RKV_INVALID_ARGUMENT,
            &["rkv_cache_evict_host: this cache has no host tier", "rkv_cache_new_host"],
        );
        check(
            rkv_cache_load_back(plain, 0, a.as_ptr(), 8, 8, &mut ticket),
            RKV_INVALID_ARGUMENT,
            &["rkv_cache_load_back: this cache has no host tier"],
        );
        check(rkv_cache_evict_host(null(), 8, &mut ev), RKV_NULL_ARGUMENT, &["cache is NULL"]);
        check(rkv_cache_evict_host(c, 8, null_mut()), RKV_NULL_ARGUMENT, &["out_evicted is NULL"]);
        // Unknown tickets, and each output of the takes NULL.
        check(
            rkv_cache_load_wait(c, 12345, o, 8, &mut len, &mut res),
            RKV_INVALID_ARGUMENT,
            &["load-back ticket 12345 is unknown"],
        );
        check(
            rkv_cache_load_poll(c, 12345, o, 8, &mut len, &mut res, &mut done),
            RKV_INVALID_ARGUMENT,
            &["ticket 12345"],
        );
        check(
            rkv_cache_load_wait(null(), 1, o, 8, &mut len, &mut res),
            RKV_NULL_ARGUMENT,
            &["cache is NULL"],
        );
        check(
            rkv_cache_load_poll(null(), 1, o, 8, &mut len, &mut res, &mut done),
            RKV_NULL_ARGUMENT,
            &["cache is NULL"],
        );
    }
    // A real ticket: each NULL output refused, the ticket still takeable afterwards.
    // SAFETY: as above.
    unsafe {
        let mut t = 0u64;
        assert_eq!(rkv_cache_load_back(c, 0, a.as_ptr(), 8, 8, &mut t), RKV_OK);
        check(
            rkv_cache_load_wait(c, t, null_mut(), 8, &mut len, &mut res),
            RKV_NULL_ARGUMENT,
            &["out_slots is NULL"],
        );
        check(
            rkv_cache_load_wait(c, t, o, 8, null_mut(), &mut res),
            RKV_NULL_ARGUMENT,
            &["out_len is NULL"],
        );
        check(
            rkv_cache_load_wait(c, t, o, 8, &mut len, null_mut()),
            RKV_NULL_ARGUMENT,
            &["out_result is NULL"],
        );
        check(
            rkv_cache_load_poll(c, t, o, 8, &mut len, &mut res, null_mut()),
            RKV_NULL_ARGUMENT,
            &["out_done is NULL"],
        );
        assert_eq!(
            (ticket, len, res.lock, done, ev),
            (0xdead, 0xdead, 0xfeed, 7, 0xdead),
            "nothing written"
        );
        assert_eq!(rkv_cache_load_wait(c, t, o, 8, &mut len, &mut res), RKV_OK);
        assert_eq!((len, res.loaded), (8, 8));
        assert_eq!(rkv_release(c, res.lock), RKV_OK);
    }
    let (after, ta) = (stats(c), tier_stats(c));
    assert_eq!(ta.load_backs, tb.load_backs + 1, "only the good load-back ran");
    assert_eq!(after.free_slots + 8, before.free_slots, "only its slots left the pool");
    let pa = stats(plain);
    assert_eq!((pa.cached_tokens, pa.free_slots), (pb.cached_tokens, pb.free_slots));
    // SAFETY: both were made here and are freed once.
    unsafe {
        rkv_cache_free(c);
        rkv_cache_free(plain);
    }
}

#[test]
fn a_load_back_the_device_cannot_hold_is_out_of_slots_and_changes_nothing() {
    let c = host_cache(8, 32);
    let a: Vec<u32> = (1..=8).collect();
    insert(c, &a);
    let mut n = 0usize;
    let mut held = [0u32; 8];
    // SAFETY: `c` is live; the outputs are live locals.
    unsafe {
        assert_eq!(rkv_cache_wait_all(c), rkv_status::RKV_OK);
        assert_eq!(rkv_evict(c, 8, None, null_mut(), &mut n), rkv_status::RKV_OK);
        assert_eq!(rkv_alloc(c, 8, held.as_mut_ptr()), rkv_status::RKV_OK); // the whole pool
    }
    let (before, tb) = (stats(c), tier_stats(c));
    let mut ticket = 0xdead_u64;
    // SAFETY: as above.
    unsafe {
        let st = rkv_cache_load_back(c, 0, a.as_ptr(), 8, usize::MAX, &mut ticket);
        check(st, rkv_status::RKV_OUT_OF_SLOTS, &["rkv_cache_load_back"]);
    }
    assert_eq!(ticket, 0xdead);
    let (after, ta) = (stats(c), tier_stats(c));
    assert_eq!((after.free_slots, after.cached_tokens), (before.free_slots, before.cached_tokens));
    assert_eq!(
        (ta.host_backed_slots, ta.host_pinned_pages),
        (tb.host_backed_slots, tb.host_pinned_pages)
    );
    // SAFETY: as above; `c` is freed once.
    unsafe {
        assert_eq!(rkv_free(c, held.as_ptr(), 8), rkv_status::RKV_OK);
        assert_eq!(
            rkv_cache_load_back(c, 0, a.as_ptr(), 8, usize::MAX, &mut ticket),
            rkv_status::RKV_OK
        );
        rkv_cache_free(c);
    }
}
