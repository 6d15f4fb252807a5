//! Every error path of the C ABI: the status, the message `rkv_last_error_message` gives
//! (it names the function, the argument and the values), and that no output was written.

use super::*;

use std::ffi::{CStr, c_void};

use radixkv_core::pool::SlotPool;

use std::ptr::{null, null_mut};

/// This thread's last error message.
fn last() -> String {
    // SAFETY: `rkv_last_error_message` returns a NUL-terminated string, never NULL, valid
    // until the next status-returning call on this thread (it is copied at once).
    unsafe { CStr::from_ptr(rkv_last_error_message()) }.to_str().unwrap().to_owned()
}

/// Asserts that `got` is `want` and that the message contains every one of `needles`.
#[track_caller]
fn check(got: rkv_status, want: rkv_status, needles: &[&str]) {
    let m = last();
    assert_eq!(got, want, "message: {m}");
    for n in needles {
        assert!(m.contains(n), "{m:?} lacks {n:?}");
    }
}

/// A cache with `opts`; freed by the caller.
fn new_cache(page_size: u32, pool_slots: u64) -> *mut rkv_cache {
    let o = rkv_options { page_size, pool_slots, ..rkv_options_default() };
    let mut c = null_mut();
    // SAFETY: both pointers point to live locals.
    assert_eq!(unsafe { rkv_cache_new(&o, &mut c) }, rkv_status::RKV_OK);
    assert_eq!(last(), "", "a success clears the message");
    c
}

/// `n` slots from the pool of `c`.
fn alloc(c: *const rkv_cache, n: usize) -> Vec<u32> {
    let mut v = vec![0u32; n];
    // SAFETY: `c` is live; `v` has room for `n` slots.
    assert_eq!(unsafe { rkv_alloc(c, n, v.as_mut_ptr()) }, rkv_status::RKV_OK, "{}", last());
    v
}

fn stats(c: *const rkv_cache) -> rkv_stats {
    let mut s = rkv_stats::default();
    // SAFETY: `c` is live; `s` is a live local.
    assert_eq!(unsafe { rkv_cache_stats(c, &mut s) }, rkv_status::RKV_OK);
    s
}

/// A pointer of type `T` one byte into a buffer: misaligned for any `T` wider than a byte.
fn misaligned<T>(buf: &mut [u64; 8]) -> *mut T {
    // SAFETY: one byte into an 8-word buffer stays inside it.
    unsafe { buf.as_mut_ptr().cast::<u8>().add(1).cast::<T>() }
}

const S: usize = 0xdead; // an output sentinel
const LOCK_S: rkv_lock = 0xfeed; // a lock output sentinel

#[test]
fn no_error_yet_is_the_empty_string_and_never_null() {
    std::thread::spawn(|| {
        assert!(!rkv_last_error_message().is_null());
        assert_eq!(last(), "");
    })
    .join()
    .unwrap();
}

#[test]
fn a_success_clears_it_and_status_free_functions_leave_it() {
    let c = new_cache(1, 0);
    let mut n = S;
    // SAFETY: `c` is live; the other pointers are NULL or live locals.
    unsafe {
        check(rkv_lock_len(c, 0, &mut n), rkv_status::RKV_INVALID_LOCK, &["rkv_lock_len"]);
        // Functions returning no status leave it.
        let _ = rkv_version();
        let _ = rkv_abi_version();
        let _ = rkv_status_str(3);
        let _ = rkv_options_default();
        rkv_cache_free(null_mut());
        assert!(last().starts_with("rkv_lock_len: lock 0x0"), "{}", last());
        // A failure replaces it; a success clears it.
        check(rkv_release(c, 0), rkv_status::RKV_INVALID_LOCK, &["rkv_release: lock 0x0"]);
        assert_eq!(rkv_reclaim(c), rkv_status::RKV_OK);
        assert_eq!(last(), "");
        rkv_cache_free(c);
    }
}

#[test]
fn messages_are_per_thread() {
    let c = new_cache(1, 0) as usize;
    // SAFETY: `c` is live.
    check(unsafe { rkv_release(c as *const _, 0) }, rkv_status::RKV_INVALID_LOCK, &["lock"]);
    std::thread::spawn(move || {
        assert_eq!(last(), "", "another thread's failure is not this thread's");
        // SAFETY: `c` is live (freed after the join).
        check(unsafe { rkv_cache_reset(null()) }, rkv_status::RKV_NULL_ARGUMENT, &["reset"]);
        // SAFETY: as above.
        assert_eq!(unsafe { rkv_reclaim(c as *const _) }, rkv_status::RKV_OK);
    })
    .join()
    .unwrap();
    assert!(last().starts_with("rkv_release: lock 0x0"), "{}", last());
    // SAFETY: `c` is live and nothing else uses it.
    unsafe { rkv_cache_free(c as *mut _) };
}

#[test]
fn a_caught_panic_says_so() {
    assert_eq!(boundary("rkv_test", || panic!("boom {}", 7)), rkv_status::RKV_INTERNAL_ERROR);
    let m = last();
    assert!(m.starts_with("rkv_test: internal error: a panic inside radixkv"), "{m}");
    assert!(m.contains("boom 7"), "{m}");
    assert_eq!(boundary("rkv_test", || panic!("static")), rkv_status::RKV_INTERNAL_ERROR);
    assert!(last().contains("static"));
    assert_eq!(boundary("rkv_test", || Ok(())), rkv_status::RKV_OK);
    assert_eq!(last(), "");
}

#[test]
fn a_nul_in_a_message_does_not_cut_it() {
    set_last_error("f", "a\0b");
    assert_eq!(last(), "f: ab");
    clear_last_error();
}

#[test]
fn cache_new() {
    let ok = rkv_options_default();
    let sentinel = std::ptr::dangling_mut::<rkv_cache>();
    let mut out = sentinel;
    let mut buf = [0u64; 8];
    let cases: [(rkv_options, &[&str]); 4] = [
        (
            rkv_options { eviction_policy: 7, ..ok },
            &["opts->eviction_policy = 7", "0 = RKV_EVICT_LRU", "6 = RKV_EVICT_SLRU"],
        ),
        (rkv_options { page_size: 0, ..ok }, &["opts->page_size = 0", "at least 1"]),
        (
            rkv_options { pool_slots: (1 << 32) + 1, ..ok },
            &["opts->pool_slots = 4294967297", "2^32"],
        ),
        (
            rkv_options { page_size: 16, pool_slots: 100, ..ok },
            &["opts->pool_slots = 100 is not a multiple of opts->page_size = 16"],
        ),
    ];
    // SAFETY: every pointer is NULL, misaligned (checked before use) or a live local.
    unsafe {
        check(
            rkv_cache_new(null(), &mut out),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_cache_new: opts is NULL"],
        );
        check(
            rkv_cache_new(&ok, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_cache_new: out_cache is NULL"],
        );
        check(
            rkv_cache_new(misaligned(&mut buf), &mut out),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["opts = 0x", "not aligned to 8 bytes"],
        );
        check(
            rkv_cache_new(&ok, misaligned(&mut buf)),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["out_cache = 0x"],
        );
        for (bad, needles) in cases {
            check(rkv_cache_new(&bad, &mut out), rkv_status::RKV_INVALID_ARGUMENT, needles);
        }
    }
    assert_eq!(out, sentinel, "no output on failure");
}

#[test]
fn the_cache_pointer() {
    let mut n = S;
    let bad = std::ptr::dangling::<u8>().wrapping_add(1).cast::<rkv_cache>();
    // SAFETY: NULL and misaligned pointers are refused before any use.
    unsafe {
        check(
            rkv_lock_len(null(), 1, &mut n),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_lock_len: cache is NULL"],
        );
        check(
            rkv_cache_stats(bad, null_mut()),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_cache_stats: cache = 0x", "misaligned"],
        );
        check(rkv_reclaim(null()), rkv_status::RKV_NULL_ARGUMENT, &["rkv_reclaim: cache is NULL"]);
        check(rkv_cache_reset(null()), rkv_status::RKV_NULL_ARGUMENT, &["rkv_cache_reset"]);
    }
    assert_eq!(n, S);
}

#[test]
fn match_and_match_lock() {
    let c = new_cache(1, 0);
    let toks = [1u32, 2, 3, 4];
    let slots = [10u32, 11, 12, 13];
    let mut e = S;
    let mut buf = [0u64; 8];
    let (mut out, mut len, mut lock) = ([7u32; 4], S, LOCK_S);
    // SAFETY: every pointer is NULL, misaligned (refused before use), or a live local of
    // the size given.
    unsafe {
        assert_eq!(rkv_insert(c, 0, toks.as_ptr(), slots.as_ptr(), 4, &mut e), rkv_status::RKV_OK);
        let o = out.as_mut_ptr();
        check(
            rkv_match(c, 0, null(), 3, o, 4, &mut len),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_match: tokens is NULL but n_tokens = 3"],
        );
        check(
            rkv_match(c, 0, misaligned(&mut buf), 2, o, 4, &mut len),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_match: tokens = 0x", "not aligned to 4 bytes"],
        );
        check(
            rkv_match(c, 0, toks.as_ptr(), usize::MAX, o, 4, &mut len),
            rkv_status::RKV_INVALID_ARGUMENT,
            &[&format!("n_tokens = {} is too large", usize::MAX)],
        );
        check(
            rkv_match(c, 0, toks.as_ptr(), 4, null_mut(), 2, &mut len),
            rkv_status::RKV_NULL_ARGUMENT,
            &["out_slots is NULL but out_cap = 2"],
        );
        check(
            rkv_match(c, 0, toks.as_ptr(), 4, o, 4, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_match: out_len is NULL"],
        );
        assert_eq!(len, S);
        check(
            rkv_match(c, 0, toks.as_ptr(), 4, o, 2, &mut len),
            rkv_status::RKV_BUFFER_TOO_SMALL,
            &["rkv_match: out_cap = 2 is smaller than the match of 4 tokens (*out_len = 4)"],
        );
        assert_eq!(len, 4, "the required length comes back");
        len = S;
        check(
            rkv_match_lock(c, 0, toks.as_ptr(), 4, o, 4, &mut len, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_match_lock: out_lock is NULL"],
        );
        check(
            rkv_match_lock(c, 0, toks.as_ptr(), 4, o, 3, &mut len, &mut lock),
            rkv_status::RKV_BUFFER_TOO_SMALL,
            &[
                "rkv_match_lock: out_cap = 3 is smaller than the match of 4 tokens",
                "nothing was pinned",
            ],
        );
        assert_eq!((len, lock), (4, LOCK_S));
        assert_eq!(out, [7; 4], "no slots written on failure");
        assert_eq!(stats(c).protected_tokens, 0, "nothing pinned");
        rkv_cache_free(c);
    }
}

#[test]
fn match_runs_and_match_lock_runs() {
    let c = new_cache(1, 0);
    let toks = [1u32, 2, 3, 4];
    let slots = [10u32, 11, 20, 21]; // two runs
    let mut e = S;
    let blank = rkv_slot_run { start: 9, len: 9 };
    let (mut out, mut n_runs, mut len, mut lock) = ([blank; 4], S, S, LOCK_S);
    // SAFETY: every pointer is NULL or a live local of the size given.
    unsafe {
        assert_eq!(rkv_insert(c, 0, toks.as_ptr(), slots.as_ptr(), 4, &mut e), rkv_status::RKV_OK);
        let o = out.as_mut_ptr();
        check(
            rkv_match_runs(c, 0, toks.as_ptr(), 4, null_mut(), 1, &mut n_runs, &mut len),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_match_runs: out_runs is NULL but out_cap = 1"],
        );
        check(
            rkv_match_runs(c, 0, toks.as_ptr(), 4, o, 4, null_mut(), &mut len),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_match_runs: out_n_runs is NULL"],
        );
        assert_eq!((n_runs, len), (S, S));
        check(
            rkv_match_runs(c, 0, toks.as_ptr(), 4, o, 1, &mut n_runs, &mut len),
            rkv_status::RKV_BUFFER_TOO_SMALL,
            &["out_cap = 1 is smaller than the 2 runs of the match of 4 tokens"],
        );
        assert_eq!((n_runs, len), (2, 4));
        (n_runs, len) = (S, S);
        check(
            rkv_match_lock_runs(c, 0, toks.as_ptr(), 4, o, 4, &mut n_runs, &mut len, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_match_lock_runs: out_lock is NULL"],
        );
        check(
            rkv_match_lock_runs(c, 0, toks.as_ptr(), 4, o, 1, &mut n_runs, &mut len, &mut lock),
            rkv_status::RKV_BUFFER_TOO_SMALL,
            &["rkv_match_lock_runs: out_cap = 1", "nothing was pinned"],
        );
        assert_eq!((n_runs, len, lock), (2, 4, LOCK_S));
        assert_eq!(out, [blank; 4]);
        rkv_cache_free(c);
    }
}

#[test]
fn insert_names_the_slot_and_its_position() {
    let c = new_cache(1, 65536);
    let free_before = stats(c).free_slots;
    let toks = [1u32, 2, 3, 4, 5];
    let mut e = S;
    let mut lock = LOCK_S;
    // SAFETY: every pointer is NULL or a live local of the size given.
    unsafe {
        let a = alloc(c, 4);
        let free_now = stats(c).free_slots;
        assert_eq!(free_now, free_before - 4);
        // Out of range, at position 3.
        let s = [a[0], a[1], a[2], 70000];
        check(
            rkv_insert(c, 0, toks.as_ptr(), s.as_ptr(), 4, &mut e),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_insert: slots[3] = 70000 is out of range: the pool has 65536 slots"],
        );
        // A free slot (never allocated), at position 1.
        let s = [a[0], 60000, a[2], a[3]];
        check(
            rkv_insert(c, 0, toks.as_ptr(), s.as_ptr(), 4, &mut e),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_insert: slots[1] = 60000 is free, not held by the caller"],
        );
        // The same slot twice.
        let s = [a[0], a[1], a[0], a[3]];
        check(
            rkv_insert_lock(c, 0, toks.as_ptr(), s.as_ptr(), 4, &mut e, &mut lock),
            rkv_status::RKV_INVALID_ARGUMENT,
            &[&format!(
                "rkv_insert_lock: slots[0] = {} is given twice (also slots[2] = {})",
                a[0], a[0]
            )],
        );
        assert_eq!((e, lock), (S, LOCK_S), "no output on failure");
        assert_eq!(stats(c).free_slots, free_now, "the pool is unchanged");
        assert_eq!(stats(c).cached_tokens, 0, "the tree is unchanged");
        // A slot the tree caches already, at another position.
        assert_eq!(rkv_insert(c, 0, toks.as_ptr(), a[..2].as_ptr(), 2, &mut e), rkv_status::RKV_OK);
        e = S;
        let s = [a[2], a[1]];
        check(
            rkv_insert(c, 7, toks.as_ptr(), s.as_ptr(), 2, &mut e),
            rkv_status::RKV_INVALID_ARGUMENT,
            &[&format!(
                "rkv_insert: slots[1] = {} is cached by the tree, not held by the caller",
                a[1]
            )],
        );
        // Pointers.
        check(
            rkv_insert(c, 0, toks.as_ptr(), null(), 2, &mut e),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_insert: slots is NULL but n_tokens = 2"],
        );
        check(
            rkv_insert(c, 0, toks.as_ptr(), s.as_ptr(), 2, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_insert: out_existing is NULL"],
        );
        check(
            rkv_insert_lock(c, 0, toks.as_ptr(), s.as_ptr(), 2, &mut e, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_insert_lock: out_lock is NULL"],
        );
        assert_eq!((e, lock), (S, LOCK_S));
        rkv_cache_free(c);
    }
}

#[test]
fn insert_runs_names_the_run() {
    let c = new_cache(1, 65536);
    let toks = [1u32, 2, 3, 4];
    let mut e = S;
    let mut lock = LOCK_S;
    let r = |start, len| rkv_slot_run { start, len };
    // SAFETY: every pointer is NULL or a live local of the size given.
    unsafe {
        let a = alloc(c, 4);
        let cases: [(Vec<rkv_slot_run>, &[&str]); 5] = [
            (
                vec![r(a[0], 2), r(5, 0), r(a[2], 2)],
                &["rkv_insert_runs: runs[1] = {start 5, len 0} is empty"],
            ),
            (
                vec![r(u32::MAX, 4)],
                &["runs[0] = {start 4294967295, len 4} goes past the largest slot id"],
            ),
            (vec![r(a[0], 3)], &["the 1 runs hold 3 slots but n_tokens = 4"]),
            (
                vec![r(a[0], 2), r(65534, 2)],
                &["runs[1] = {start 65534, len 2}: slot 65534 is free"],
            ),
            (
                vec![r(a[0], 2), r(65535, 2)],
                &["runs[1] = {start 65535, len 2}: slot 65536 is out of range"],
            ),
        ];
        for (runs, needles) in cases {
            let got = rkv_insert_runs(c, 0, toks.as_ptr(), 4, runs.as_ptr(), runs.len(), &mut e);
            check(got, rkv_status::RKV_INVALID_ARGUMENT, needles);
        }
        let runs = [r(a[0], 2), r(a[0], 2)];
        check(
            rkv_insert_lock_runs(c, 0, toks.as_ptr(), 4, runs.as_ptr(), 2, &mut e, &mut lock),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_insert_lock_runs: runs[0] = {start", "is given twice (also runs[1]"],
        );
        check(
            rkv_insert_runs(c, 0, toks.as_ptr(), 4, null(), 2, &mut e),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_insert_runs: runs is NULL but n_runs = 2"],
        );
        assert_eq!((e, lock), (S, LOCK_S));
        assert_eq!(stats(c).cached_tokens, 0);
        rkv_cache_free(c);
    }
}

#[test]
fn locks_say_why_they_are_refused() {
    let c = new_cache(1, 0);
    let other = new_cache(1, 0);
    let toks = [1u32, 2];
    let (mut out, mut len, mut lock) = ([0u32; 2], S, LOCK_S);
    // SAFETY: every pointer is a live local of the size given, or NULL.
    unsafe {
        assert_eq!(
            rkv_match_lock(c, 0, toks.as_ptr(), 2, out.as_mut_ptr(), 2, &mut len, &mut lock),
            rkv_status::RKV_OK
        );
        let h = lock;
        len = S;
        check(
            rkv_lock_len(other, h, &mut len),
            rkv_status::RKV_INVALID_LOCK,
            &[&format!("rkv_lock_len: lock {h:#x} is not a lock of this cache")],
        );
        check(
            rkv_release(other, h),
            rkv_status::RKV_INVALID_LOCK,
            &["is not a lock of this cache"],
        );
        check(rkv_lock_len(c, h, null_mut()), rkv_status::RKV_NULL_ARGUMENT, &["out_len is NULL"]);
        check(rkv_release(c, 0), rkv_status::RKV_INVALID_LOCK, &["0 is never a valid lock"]);
        assert_eq!(rkv_release(c, h), rkv_status::RKV_OK);
        check(
            rkv_release(c, h),
            rkv_status::RKV_INVALID_LOCK,
            &[&format!("rkv_release: lock {h:#x} was released already")],
        );
        check(
            rkv_lock_len(c, h, &mut len),
            rkv_status::RKV_INVALID_LOCK,
            &["was released already"],
        );
        // Same cache tag, an index never handed out.
        let never = h | (((1u64 << 19) - 1) << 20);
        check(rkv_release(c, never), rkv_status::RKV_INVALID_LOCK, &["was never handed out"]);
        assert_eq!(len, S);
        rkv_cache_free(c);
        rkv_cache_free(other);
    }
}

#[test]
fn evict() {
    let c = new_cache(1, 0);
    let mut n = S;
    // SAFETY: every pointer is a live local or NULL.
    unsafe {
        check(
            rkv_evict(c, 1, None, null_mut(), &mut n),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_evict: free_fn is NULL, but this cache has no pool"],
        );
        check(
            rkv_evict_runs(c, 1, None, null_mut(), &mut n),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_evict_runs: free_fn is NULL"],
        );
        check(
            rkv_evict_runs(c, 1, None, null_mut(), null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_evict_runs: out_evicted is NULL"],
        );
        assert_eq!(n, S);
        rkv_cache_free(c);
    }
}

#[test]
fn alloc_and_alloc_runs() {
    let nopool = new_cache(1, 0);
    let c = new_cache(4, 64);
    let mut out = [7u32; 16];
    let blank = rkv_slot_run { start: 9, len: 9 };
    let (mut runs, mut n_runs) = ([blank; 16], S);
    // SAFETY: every pointer is a live local of the size given, or NULL.
    unsafe {
        let o = out.as_mut_ptr();
        check(
            rkv_alloc(nopool, 1, o),
            rkv_status::RKV_NO_POOL,
            &["rkv_alloc: this cache has no slot pool (it was created with pool_slots = 0"],
        );
        check(
            rkv_alloc_runs(nopool, 1, runs.as_mut_ptr(), 16, &mut n_runs),
            rkv_status::RKV_NO_POOL,
            &["rkv_alloc_runs: this cache has no slot pool"],
        );
        check(
            rkv_alloc(c, 4, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_alloc: out_slots is NULL but n_slots = 4"],
        );
        check(
            rkv_alloc(c, 100, o),
            rkv_status::RKV_OUT_OF_SLOTS,
            &["rkv_alloc: n_slots = 100 is more than the whole pool of 64 slots"],
        );
        check(
            rkv_alloc(c, 3, o),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_alloc: n_slots = 3 is not a multiple of the page size 4"],
        );
        let held = alloc(c, 56);
        check(
            rkv_alloc(c, 16, o),
            rkv_status::RKV_OUT_OF_SLOTS,
            &["rkv_alloc: n_slots = 16, but only 8 slots are free or evictable"],
        );
        check(
            rkv_alloc_runs(c, 16, runs.as_mut_ptr(), 16, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_alloc_runs: out_n_runs is NULL"],
        );
        check(
            rkv_alloc_runs(c, 16, runs.as_mut_ptr(), 16, &mut n_runs),
            rkv_status::RKV_OUT_OF_SLOTS,
            &["rkv_alloc_runs: n_slots = 16, but only 8"],
        );
        assert_eq!(n_runs, S);
        // Free every other page: the next allocation of 3 pages comes in 3 runs.
        let pages: Vec<u32> = held.chunks(4).step_by(2).flatten().copied().collect();
        assert_eq!(rkv_free(c, pages.as_ptr(), pages.len()), rkv_status::RKV_OK);
        let got = rkv_alloc_runs(c, 12, runs.as_mut_ptr(), 1, &mut n_runs);
        if got == rkv_status::RKV_BUFFER_TOO_SMALL {
            check(
                got,
                got,
                &[
                    "rkv_alloc_runs: out_cap = 1 is smaller than the",
                    "the slots went back to the pool",
                ],
            );
            assert!(n_runs > 1);
        } else {
            assert_eq!(got, rkv_status::RKV_OK, "{}", last());
        }
        assert_eq!(out, [7; 16]);
        assert_eq!(runs[1..], [blank; 15]);
        rkv_cache_free(nopool);
        rkv_cache_free(c);
    }
}

#[test]
fn free_and_free_runs() {
    let nopool = new_cache(1, 0);
    let c = new_cache(1, 1024);
    let toks = [1u32, 2];
    let mut e = S;
    let r = |start, len| rkv_slot_run { start, len };
    // SAFETY: every pointer is a live local of the size given, or NULL.
    unsafe {
        let x = [1u32];
        check(
            rkv_free(nopool, x.as_ptr(), 1),
            rkv_status::RKV_NO_POOL,
            &["rkv_free: this cache has no slot pool"],
        );
        check(rkv_free_runs(nopool, null(), 0), rkv_status::RKV_NO_POOL, &["rkv_free_runs"]);
        check(
            rkv_free(c, null(), 3),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_free: slots is NULL but n_slots = 3"],
        );
        let a = alloc(c, 4);
        let free_now = stats(c).free_slots;
        let s = [a[0], 5000];
        check(
            rkv_free(c, s.as_ptr(), 2),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_free: slots[1] = 5000 is out of range: the pool has 1024 slots (ids 0 to 1023)"],
        );
        let s = [a[0], a[1], a[1]];
        check(
            rkv_free(c, s.as_ptr(), 3),
            rkv_status::RKV_DOUBLE_FREE,
            &[&format!("rkv_free: slots[1] = {} is given twice (also slots[2] = {})", a[1], a[1])],
        );
        assert_eq!(stats(c).free_slots, free_now, "refused whole");
        assert_eq!(rkv_free(c, a[3..].as_ptr(), 1), rkv_status::RKV_OK);
        let s = [a[2], a[3]];
        check(
            rkv_free(c, s.as_ptr(), 2),
            rkv_status::RKV_DOUBLE_FREE,
            &[&format!("rkv_free: slots[1] = {} is free, not held by the caller", a[3])],
        );
        assert_eq!(rkv_insert(c, 0, toks.as_ptr(), a.as_ptr(), 2, &mut e), rkv_status::RKV_OK);
        check(
            rkv_free(c, a[1..].as_ptr(), 1),
            rkv_status::RKV_DOUBLE_FREE,
            &[&format!("rkv_free: slots[0] = {} is cached by the tree", a[1])],
        );
        let runs = [r(a[2], 1), r(7, 0)];
        check(
            rkv_free_runs(c, runs.as_ptr(), 2),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_free_runs: runs[1] = {start 7, len 0} is empty"],
        );
        let runs = [r(a[2], 1), r(1020, 8)];
        check(
            rkv_free_runs(c, runs.as_ptr(), 2),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_free_runs: runs[1] = {start 1020, len 8}: slot 1024 is out of range"],
        );
        let runs = [r(a[2], 2)];
        check(
            rkv_free_runs(c, runs.as_ptr(), 1),
            rkv_status::RKV_DOUBLE_FREE,
            &[&format!(
                "rkv_free_runs: runs[0] = {{start {}, len 2}}: slot {} is free",
                a[2], a[3]
            )],
        );
        rkv_cache_free(nopool);
        rkv_cache_free(c);
    }
}

#[test]
fn stats_reset_and_reclaim() {
    let c = new_cache(1, 0);
    let mut buf = [0u64; 8];
    // SAFETY: NULL and misaligned outputs are refused before use.
    unsafe {
        check(
            rkv_cache_stats(c, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_cache_stats: out_stats is NULL"],
        );
        check(
            rkv_cache_stats(c, misaligned(&mut buf)),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_cache_stats: out_stats = 0x", "not aligned to 8 bytes"],
        );
        assert_eq!(buf, [0; 8]);
        rkv_cache_free(c);
    }
}

#[test]
fn core_slot_refusals_carry_the_slot_and_the_problem() {
    // `slot_refusal` reads the slot and the problem from `Error::Slot`'s fields (and the
    // slot of `Error::DoubleFree`): every pool refusal of a given slot carries them.
    let pool = SlotPool::new(16, 1).unwrap();
    let mut held = Vec::new();
    assert!(pool.try_alloc(2, &mut held).unwrap());
    for (e, want) in [
        (pool.free(&[99]).unwrap_err(), 99),
        (pool.check_held(&[held[0], 14]).unwrap_err(), 14),
        (pool.check_held(&[held[0], held[0]]).unwrap_err(), held[0]),
        (pool.free(&[held[0], held[0]]).unwrap_err(), held[0]),
    ] {
        let (slot, _) = e.slot().unwrap_or_else(|| panic!("{e}"));
        assert_eq!(slot, want, "{e}");
        assert_eq!(rkv_status::from(&e) as i32, e.status(), "{e}");
    }
}

/// A `rkv_free_fn` appending the slots to the `Vec<u32>` behind `ctx`.
unsafe extern "C" fn collect(ctx: *mut c_void, slots: *const u32, n: usize) {
    // SAFETY: the tests pass a live `Vec<u32>` as `ctx`, and the cache a live array of `n`.
    unsafe { (*ctx.cast::<Vec<u32>>()).extend_from_slice(std::slice::from_raw_parts(slots, n)) }
}

fn ns_stats(c: *const rkv_cache, ns: u64) -> rkv_namespace_stats {
    let mut s = rkv_namespace_stats::default();
    // SAFETY: `c` is live; `s` is a live local.
    let st = unsafe { rkv_cache_namespace_stats(c, ns, &mut s) };
    assert_eq!(st, rkv_status::RKV_OK, "{}", last());
    assert_eq!(last(), "");
    s
}

fn ns_count(c: *const rkv_cache) -> u64 {
    let mut n = u64::MAX;
    // SAFETY: `c` is live; `n` is a live local.
    assert_eq!(unsafe { rkv_namespace_count(c, &mut n) }, rkv_status::RKV_OK, "{}", last());
    n
}

#[test]
fn drop_namespace_caller_managed() {
    let c = new_cache(1, 0);
    let t: Vec<u32> = (1..=8).collect();
    let s1: Vec<u32> = (100..108).collect();
    let s2: Vec<u32> = (200..208).collect();
    let mut freed: Vec<u32> = Vec::new();
    let ctx = (&raw mut freed).cast::<c_void>();
    // SAFETY: every pointer is a live local of the stated length, or NULL.
    unsafe {
        assert_eq!(ns_count(c), 0);
        let mut e = 0;
        assert_eq!(rkv_insert(c, 1, t.as_ptr(), s1.as_ptr(), 8, &mut e), rkv_status::RKV_OK);
        assert_eq!(rkv_insert(c, 2, t.as_ptr(), s2.as_ptr(), 8, &mut e), rkv_status::RKV_OK);
        assert_eq!(ns_count(c), 2);
        assert_eq!(
            ns_stats(c, 1),
            rkv_namespace_stats {
                cached_tokens: 8,
                evictable_tokens: 8,
                protected_tokens: 0,
                nodes: 1
            }
        );
        // Pin the first 4 tokens of namespace 1 (a second insert splits its edge).
        let (mut out, mut len, mut lock) = ([0u32; 4], 0, 0);
        let st = rkv_match_lock(c, 1, t.as_ptr(), 4, out.as_mut_ptr(), 4, &mut len, &mut lock);
        assert_eq!((st, len), (rkv_status::RKV_OK, 4));
        let s = ns_stats(c, 1);
        assert_eq!((s.cached_tokens, s.protected_tokens, s.evictable_tokens), (8, 4, 4));

        // Bad inputs: a status, a message, nothing written, nothing dropped.
        let mut n = S;
        check(
            rkv_drop_namespace(c, 1, None, null_mut(), &mut n),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_drop_namespace: free_fn is NULL, but this cache has no pool"],
        );
        check(
            rkv_drop_namespace(c, 1, Some(collect), ctx, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_drop_namespace: out_freed is NULL"],
        );
        let mut buf = [0u64; 8];
        check(
            rkv_drop_namespace(c, 1, Some(collect), ctx, misaligned(&mut buf)),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_drop_namespace: out_freed = 0x", "not aligned to 8 bytes"],
        );
        check(
            rkv_drop_namespace(null(), 1, Some(collect), ctx, &mut n),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_drop_namespace: cache is NULL"],
        );
        assert_eq!((n, buf, freed.len()), (S, [0; 8], 0));
        assert_eq!(ns_stats(c, 1).cached_tokens, 8);

        // The unpinned half goes, to the callback; the pinned half stays; ns 2 is untouched.
        assert_eq!(rkv_drop_namespace(c, 1, Some(collect), ctx, &mut n), rkv_status::RKV_OK);
        assert_eq!(last(), "");
        assert_eq!(n, 4);
        freed.sort_unstable();
        assert_eq!(freed, s1[4..]);
        let s = ns_stats(c, 1);
        assert_eq!((s.cached_tokens, s.protected_tokens, s.evictable_tokens), (4, 4, 0));
        assert_eq!(ns_stats(c, 2).cached_tokens, 8);
        assert_eq!(ns_count(c), 2);
        // Unknown namespace: 0 and RKV_OK.
        n = S;
        assert_eq!(rkv_drop_namespace(c, 99, Some(collect), ctx, &mut n), rkv_status::RKV_OK);
        assert_eq!(n, 0);
        assert_eq!(ns_stats(c, 99), rkv_namespace_stats::default());
        // Released, the rest goes and the namespace is reclaimed.
        assert_eq!(rkv_release(c, lock), rkv_status::RKV_OK);
        freed.clear();
        assert_eq!(rkv_drop_namespace(c, 1, Some(collect), ctx, &mut n), rkv_status::RKV_OK);
        assert_eq!(n, 4);
        freed.sort_unstable();
        assert_eq!(freed, s1[..4]);
        assert_eq!(ns_stats(c, 1), rkv_namespace_stats::default());
        assert_eq!(ns_count(c), 1);
        let s = stats(c);
        assert_eq!((s.cached_tokens, s.evicted_tokens), (8, 8));
        rkv_cache_free(c);
    }
}

#[test]
fn drop_namespace_with_a_pool() {
    let c = new_cache(1, 16);
    let t: Vec<u32> = (1..=6).collect();
    let slots = alloc(c, 6);
    let mut told: Vec<u32> = Vec::new();
    // SAFETY: every pointer is a live local of the stated length, or NULL.
    unsafe {
        let mut e = 0;
        assert_eq!(rkv_insert(c, 7, t.as_ptr(), slots.as_ptr(), 3, &mut e), rkv_status::RKV_OK);
        let p = slots[3..].as_ptr();
        assert_eq!(rkv_insert(c, 8, t.as_ptr(), p, 3, &mut e), rkv_status::RKV_OK);
        assert_eq!((ns_count(c), stats(c).free_slots), (2, 10));
        // No callback: the slots go back to the pool.
        let mut n = S;
        assert_eq!(rkv_drop_namespace(c, 7, None, null_mut(), &mut n), rkv_status::RKV_OK);
        assert_eq!((n, ns_count(c), stats(c).free_slots), (3, 1, 13));
        // A callback is told, and the slots still go back to the pool.
        let ctx = (&raw mut told).cast::<c_void>();
        assert_eq!(rkv_drop_namespace(c, 8, Some(collect), ctx, &mut n), rkv_status::RKV_OK);
        told.sort_unstable();
        let mut want = slots[3..].to_vec();
        want.sort_unstable();
        assert_eq!((n, told, ns_count(c), stats(c).free_slots), (3, want, 0, 16));
        // Already gone: nothing more.
        assert_eq!(rkv_drop_namespace(c, 8, None, null_mut(), &mut n), rkv_status::RKV_OK);
        assert_eq!(n, 0);
        rkv_cache_free(c);
    }
}

#[test]
fn namespace_stats_and_count_check_their_arguments() {
    let c = new_cache(1, 0);
    let bad = std::ptr::dangling::<u8>().wrapping_add(1).cast::<rkv_cache>();
    let sentinel = rkv_namespace_stats {
        cached_tokens: 1,
        evictable_tokens: 2,
        protected_tokens: 3,
        nodes: 4,
    };
    let mut s = sentinel;
    let mut n = 0xdead_u64;
    let mut buf = [0u64; 8];
    // SAFETY: NULL and misaligned pointers are refused before any use.
    unsafe {
        check(
            rkv_cache_namespace_stats(null(), 0, &mut s),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_cache_namespace_stats: cache is NULL"],
        );
        check(
            rkv_cache_namespace_stats(bad, 0, &mut s),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_cache_namespace_stats: cache = 0x", "misaligned"],
        );
        check(
            rkv_cache_namespace_stats(c, 0, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_cache_namespace_stats: out_stats is NULL"],
        );
        check(
            rkv_cache_namespace_stats(c, 0, misaligned(&mut buf)),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_cache_namespace_stats: out_stats = 0x", "not aligned to 8 bytes"],
        );
        check(
            rkv_namespace_count(null(), &mut n),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_namespace_count: cache is NULL"],
        );
        check(
            rkv_namespace_count(c, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_namespace_count: out_count is NULL"],
        );
        check(
            rkv_namespace_count(c, misaligned(&mut buf)),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_namespace_count: out_count = 0x", "not aligned to 8 bytes"],
        );
        assert_eq!((s, n, buf), (sentinel, 0xdead, [0; 8]));
        // A success clears the message; an unknown namespace is all zeros.
        assert_eq!(rkv_cache_namespace_stats(c, u64::MAX, &mut s), rkv_status::RKV_OK);
        assert_eq!((last(), s), (String::new(), rkv_namespace_stats::default()));
        rkv_cache_free(c);
    }
}

#[test]
fn cache_new_with_checks_the_policy_options() {
    let ok = rkv_options_default();
    let pol = rkv_policy_options_default();
    let sentinel = std::ptr::dangling_mut::<rkv_cache>();
    let mut out = sentinel;
    let mut buf = [0u64; 8];
    // SAFETY: every pointer is NULL, misaligned (checked before use) or a live local.
    unsafe {
        check(
            rkv_cache_new_with(null(), &pol, &mut out),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_cache_new_with: opts is NULL"],
        );
        check(
            rkv_cache_new_with(&ok, &pol, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_cache_new_with: out_cache is NULL"],
        );
        check(
            rkv_cache_new_with(&ok, misaligned(&mut buf), &mut out),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_cache_new_with: policy = 0x", "not aligned to 4 bytes"],
        );
        for size in [0, 4, 16] {
            let bad = rkv_policy_options { size, ..pol };
            check(
                rkv_cache_new_with(&ok, &bad, &mut out),
                rkv_status::RKV_INVALID_ARGUMENT,
                &[
                    &format!("rkv_cache_new_with: policy->size = {size} is not the size"),
                    "rkv_policy_options this library knows (12, or 8 from before swa_window)",
                    "rkv_policy_options_default()",
                ],
            );
        }
        let bad = rkv_options { eviction_policy: 99, ..ok };
        check(
            rkv_cache_new_with(&bad, &pol, &mut out),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_cache_new_with: opts->eviction_policy = 99", "5 = RKV_EVICT_PRIORITY"],
        );
    }
    assert_eq!(out, sentinel, "no output on failure");
}

#[test]
fn policy_names_and_the_cache_policy() {
    let c = new_cache(1, 0);
    let (mut p, mut t) = (0xdead_u32, 0xbeef_u32);
    let mut buf = [0u64; 8];
    // SAFETY: every pointer is NULL, misaligned (checked before use), a live local or a
    // NUL-terminated literal.
    unsafe {
        check(
            rkv_eviction_policy_from_name(null(), &mut p),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_eviction_policy_from_name: name is NULL"],
        );
        check(
            rkv_eviction_policy_from_name(c"lru".as_ptr(), null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_eviction_policy_from_name: out_policy is NULL"],
        );
        check(
            rkv_eviction_policy_from_name(c"lru".as_ptr(), misaligned(&mut buf)),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["out_policy = 0x", "not aligned to 4 bytes"],
        );
        check(
            rkv_eviction_policy_from_name(c"tlru".as_ptr(), &mut p),
            rkv_status::RKV_INVALID_ARGUMENT,
            &[
                "rkv_eviction_policy_from_name: name: unknown eviction policy \"tlru\"",
                "lru, lfu, fifo, mru, filo, priority, slru",
                "0 = RKV_EVICT_LRU",
            ],
        );
        check(
            rkv_cache_eviction_policy(null(), &mut p, &mut t),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_cache_eviction_policy: cache is NULL"],
        );
        check(
            rkv_cache_eviction_policy(c, null_mut(), &mut t),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_cache_eviction_policy: out_policy is NULL"],
        );
        check(
            rkv_cache_eviction_policy(c, &mut p, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_cache_eviction_policy: out_slru_threshold is NULL"],
        );
        assert_eq!((p, t, buf), (0xdead, 0xbeef, [0; 8]));
        assert_eq!(rkv_cache_eviction_policy(c, &mut p, &mut t), rkv_status::RKV_OK);
        assert_eq!((p, t, last()), (0, 2, String::new()));
        assert_eq!(rkv_eviction_policy_from_name(c"Priority".as_ptr(), &mut p), rkv_status::RKV_OK);
        assert_eq!(p, rkv_eviction_policy::RKV_EVICT_PRIORITY as u32);
        rkv_cache_free(c);
    }
}

#[test]
fn insert_options_are_checked_before_anything_changes() {
    let c = new_cache(1, 65536);
    let toks = [1u32, 2, 3, 4];
    let (mut e, mut lock) = (S, LOCK_S);
    let mut buf = [0u64; 8];
    let d = rkv_insert_options_default();
    let too_high = rkv_insert_options { priority: i32::MAX as i64 + 1, ..d };
    let too_low = rkv_insert_options { priority: i64::MIN, ..d };
    let reserved = rkv_insert_options { reserved: 1, ..d };
    let small = rkv_insert_options { size: 16, ..d };
    let cases: [(rkv_insert_options, &[&str]); 4] = [
        (too_high, &["opts->priority 2147483648 out of range", "-2147483648 to 2147483647"]),
        (too_low, &["opts->priority -9223372036854775808 out of range"]),
        (reserved, &["opts->reserved = 1 must be 0"]),
        (small, &["opts->size = 16 is not the size of an rkv_insert_options", "(24)"]),
    ];
    let r = |start, len| rkv_slot_run { start, len };
    // SAFETY: every pointer is NULL, misaligned (checked before use) or a live local of the
    // size given.
    unsafe {
        let a = alloc(c, 4);
        let runs = [r(a[0], 1), r(a[1], 1), r(a[2], 1), r(a[3], 1)];
        let (t, s, rp) = (toks.as_ptr(), a.as_ptr(), runs.as_ptr());
        for (o, needles) in &cases {
            let st = rkv_insert_ex(c, 0, t, s, 4, o, &mut e);
            check(st, rkv_status::RKV_INVALID_ARGUMENT, &[&["rkv_insert_ex: "], *needles].concat());
            let st = rkv_insert_lock_ex(c, 0, t, s, 4, o, &mut e, &mut lock);
            check(
                st,
                rkv_status::RKV_INVALID_ARGUMENT,
                &[&["rkv_insert_lock_ex: "], *needles].concat(),
            );
            let st = rkv_insert_runs_ex(c, 0, t, 4, rp, 4, o, &mut e);
            check(
                st,
                rkv_status::RKV_INVALID_ARGUMENT,
                &[&["rkv_insert_runs_ex: "], *needles].concat(),
            );
            let st = rkv_insert_lock_runs_ex(c, 0, t, 4, rp, 4, o, &mut e, &mut lock);
            let want = [&["rkv_insert_lock_runs_ex: "], *needles].concat();
            check(st, rkv_status::RKV_INVALID_ARGUMENT, &want);
        }
        check(
            rkv_insert_ex(c, 0, t, s, 4, misaligned(&mut buf), &mut e),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_insert_ex: opts = 0x", "not aligned to 8 bytes"],
        );
        // The pointers are checked first, in argument order.
        check(
            rkv_insert_ex(null(), 0, t, s, 4, &too_high, &mut e),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_insert_ex: cache is NULL"],
        );
        check(
            rkv_insert_lock_ex(c, 0, t, s, 4, &too_high, &mut e, null_mut()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_insert_lock_ex: out_lock is NULL"],
        );
        check(
            rkv_insert_runs_ex(c, 0, t, 4, null(), 4, &d, &mut e),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_insert_runs_ex: runs is NULL but n_runs = 4"],
        );
        check(
            rkv_insert_lock_runs_ex(c, 0, t, 4, rp, 4, &d, null_mut(), &mut lock),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_insert_lock_runs_ex: out_existing is NULL"],
        );
        assert_eq!((e, lock, buf), (S, LOCK_S, [0; 8]));
        assert_eq!(stats(c).cached_tokens, 0, "nothing inserted");
        // The slots are still the caller's: nothing adopted or freed.
        assert_eq!(rkv_free(c, s, 4), rkv_status::RKV_OK, "{}", last());
        // A slot refusal names the function and the slot, as rkv_insert's.
        let p = rkv_insert_options { priority: 3, ..d };
        check(
            rkv_insert_ex(c, 0, t, s, 4, &p, &mut e),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_insert_ex: slots[0] = ", "is free, not held by the caller"],
        );
        // In range at both ends; a success clears the message.
        let a = alloc(c, 4);
        let lo = rkv_insert_options { priority: i32::MIN as i64, ..d };
        assert_eq!(rkv_insert_ex(c, 0, t, a.as_ptr(), 4, &lo, &mut e), rkv_status::RKV_OK);
        assert_eq!((e, last()), (0, String::new()));
        let hi = rkv_insert_options { priority: i32::MAX as i64, ..d };
        assert_eq!(
            rkv_insert_lock_ex(c, 0, t, a.as_ptr(), 4, &hi, &mut e, &mut lock),
            rkv_status::RKV_OK
        );
        assert_eq!(e, 4);
        assert_eq!(rkv_release(c, lock), rkv_status::RKV_OK);
        rkv_cache_free(c);
    }
}
