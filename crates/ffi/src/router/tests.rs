//! The router index's C functions: the happy path and every bad input (status, message,
//! nothing written, index unchanged).

use std::ffi::{CStr, c_char};
use std::ptr::{null, null_mut};

use radixkv_core::events::wire::{WireOptions, encode_batch};
use radixkv_core::events::{EventBatch, KvEvent, Medium};
use radixkv_router::RouterError;

use super::*;
use crate::boundary::rkv_last_error_message;

const BS: u32 = 4;

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

fn opts(gap: rkv_gap_policy) -> rkv_router_options {
    rkv_router_options { block_size: BS, gap_policy: gap as u32, ..rkv_router_options_default() }
}

/// A router with `o`; freed by the caller.
fn new_router(o: rkv_router_options) -> *mut rkv_router {
    let mut r = null_mut();
    // SAFETY: both pointers point to live locals.
    assert_eq!(unsafe { rkv_router_new(&o, &mut r) }, rkv_status::RKV_OK);
    assert_eq!(last(), "");
    r
}

fn w(id: u64, rank: u32) -> rkv_worker {
    rkv_worker { worker_id: id, dp_rank: rank, reserved: 0 }
}

/// Tokens of `n` blocks starting at block `first` (block i's tokens are 10 i .. 10 i + 3).
fn toks(first: u32, n: u32) -> Vec<u32> {
    (first * 10..(first + n) * 10).filter(|t| t % 10 < BS).collect()
}

/// Stores blocks `hashes` with `tokens` for `wk` under `parent` on the GPU.
fn store(
    r: *const rkv_router,
    wk: rkv_worker,
    parent: Option<u64>,
    hashes: &[u64],
    tokens: &[u32],
) -> rkv_status {
    let p = parent.as_ref().map_or(null(), |p| p as *const u64);
    // SAFETY: every pointer points to a live local of the stated length.
    unsafe {
        rkv_router_stored(
            r,
            wk,
            null(),
            null(),
            p,
            hashes.as_ptr(),
            hashes.len(),
            tokens.as_ptr(),
            0,
        )
    }
}

/// The sorted scores of `tokens` (plain namespace).
fn find(r: *const rkv_router, tokens: &[u32]) -> Vec<rkv_router_score> {
    let mut out = vec![rkv_router_score::default(); 16];
    let mut n = 0;
    // SAFETY: every pointer points to a live local of the stated length.
    let s = unsafe {
        rkv_router_find(
            r,
            tokens.as_ptr(),
            tokens.len(),
            null(),
            null(),
            out.as_mut_ptr(),
            out.len(),
            &mut n,
        )
    };
    assert_eq!(s, rkv_status::RKV_OK, "{}", last());
    out.truncate(n);
    out.sort_by_key(|s| (s.worker.worker_id, s.worker.dp_rank));
    out
}

fn score(id: u64, dev: u32, any: u32) -> rkv_router_score {
    rkv_router_score { worker: w(id, 0), device_blocks: dev, any_blocks: any }
}

fn stats(r: *const rkv_router) -> rkv_router_stats {
    let mut s = rkv_router_stats::default();
    // SAFETY: `s` is a live local.
    assert_eq!(unsafe { rkv_router_stats_get(r, &mut s) }, rkv_status::RKV_OK);
    s
}

fn dump(r: *const rkv_router) -> Vec<u8> {
    let mut n = 0;
    // SAFETY: a NULL buffer with cap 0; `n` is a live local.
    let s = unsafe { rkv_router_dump(r, null_mut(), 0, &mut n) };
    let mut b = vec![0u8; n];
    if s == rkv_status::RKV_OK {
        return b;
    }
    assert_eq!(s, rkv_status::RKV_BUFFER_TOO_SMALL);
    let mut m = 0;
    // SAFETY: `b` has `n` bytes; `m` is a live local.
    assert_eq!(unsafe { rkv_router_dump(r, b.as_mut_ptr(), n, &mut m) }, rkv_status::RKV_OK);
    assert_eq!(m, n);
    b
}

fn next_seq(r: *const rkv_router, wk: rkv_worker) -> Option<u64> {
    let mut n = u64::MAX;
    // SAFETY: `n` is a live local.
    match unsafe { rkv_router_next_seq(r, wk, &mut n) } {
        rkv_status::RKV_OK => Some(n),
        rkv_status::RKV_NOT_FOUND => {
            assert_eq!(n, u64::MAX, "nothing written on RKV_NOT_FOUND");
            None
        }
        s => panic!("{s:?}: {}", last()),
    }
}

fn stored_event(parent: Option<u64>, hashes: &[u64], tokens: Vec<u32>) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: hashes.to_vec(),
        parent_block_hash: parent,
        token_ids: tokens,
        block_size: BS,
        lora_name: None,
        cache_salt: None,
        medium: Medium::Gpu,
    }
}

fn payload(events: Vec<KvEvent>, rank: i64) -> Vec<u8> {
    let o = WireOptions { data_parallel_rank: rank, ..WireOptions::default() };
    encode_batch(&EventBatch { ts: 1.0, events }, &o)
}

fn apply(r: *const rkv_router, id: u64, seq: u64, p: &[u8]) -> rkv_status {
    // SAFETY: `p` is a live slice.
    unsafe { rkv_router_apply_batch(r, id, seq, p.as_ptr(), p.len()) }
}

#[test]
fn options_and_creation() {
    let d = rkv_router_options_default();
    assert_eq!((d.block_size, d.max_workers, d.gap_policy, d.reserved), (16, 4096, 0, 0));
    let sentinel = std::ptr::dangling_mut::<rkv_router>();
    let mut r = sentinel;
    // SAFETY: every pointer points to a live local (or is NULL on purpose).
    unsafe {
        check(
            rkv_router_new(null(), &mut r),
            rkv_status::RKV_NULL_ARGUMENT,
            &["rkv_router_new: opts is NULL"],
        );
        check(rkv_router_new(&d, null_mut()), rkv_status::RKV_NULL_ARGUMENT, &["out is NULL"]);
        let bad = [
            (rkv_router_options { reserved: 1, ..d }, "opts->reserved = 1 must be 0"),
            (
                rkv_router_options { gap_policy: 2, ..d },
                "opts->gap_policy = 2 is not an rkv_gap_policy",
            ),
            (rkv_router_options { block_size: 0, ..d }, "opts->block_size = 0 must be at least 1"),
            (rkv_router_options { max_workers: 0, ..d }, "opts->max_workers = 0 must be 1 to 2^29"),
            (rkv_router_options { max_workers: u32::MAX, ..d }, "opts->max_workers = 4294967295"),
        ];
        for (o, msg) in bad {
            check(rkv_router_new(&o, &mut r), rkv_status::RKV_INVALID_ARGUMENT, &[msg]);
            assert_eq!(r, sentinel, "nothing written");
        }
        rkv_router_free(null_mut());
        let r = new_router(rkv_router_options { gap_policy: 1, ..d });
        assert_eq!(stats(r), rkv_router_stats { bytes: stats(r).bytes, ..Default::default() });
        assert!(stats(r).bytes > 0);
        rkv_router_free(r);
    }
}

#[test]
fn typed_events_and_finds() {
    let r = new_router(opts(rkv_gap_policy::RKV_GAP_CLEAR));
    let (a, b) = (w(1, 0), w(2, 0));
    // Worker 1 holds blocks 0..3 (engine hashes 100..), worker 2 blocks 0..1 (other
    // engine hashes: the content decides), then block 1 of worker 2 also as a host copy.
    assert_eq!(store(r, a, None, &[100, 101, 102], &toks(0, 3)), rkv_status::RKV_OK);
    assert_eq!(store(r, b, None, &[7], &toks(0, 1)), rkv_status::RKV_OK);
    assert_eq!(store(r, b, Some(7), &[8], &toks(1, 1)), rkv_status::RKV_OK);
    let q = toks(0, 4);
    assert_eq!(find(r, &q), [score(1, 3, 3), score(2, 2, 2)]);
    // A partial last block is ignored.
    let mut partial = toks(0, 3);
    partial.push(99);
    assert_eq!(find(r, &partial), [score(1, 3, 3), score(2, 2, 2)]);
    // SAFETY: every pointer points to a live local of the stated length.
    unsafe {
        let t = toks(1, 1);
        let s = rkv_router_stored(r, b, null(), null(), &7, [8u64].as_ptr(), 1, t.as_ptr(), 1);
        assert_eq!(s, rkv_status::RKV_OK);
        // Worker 2 drops block 1's device copy: the host copy still counts for any_blocks.
        assert_eq!(rkv_router_removed(r, b, [8u64].as_ptr(), 1, 0), rkv_status::RKV_OK);
        assert_eq!(find(r, &q), [score(1, 3, 3), score(2, 1, 2)]);
        // find_hashes with the content hashes the router computes itself.
        let mut h = Vec::new();
        radixkv_router::content_hashes(&q, BS, None, None, &mut h);
        let mut out = [rkv_router_score::default(); 4];
        let mut n = 0;
        let s = rkv_router_find_hashes(r, h.as_ptr(), h.len(), out.as_mut_ptr(), 4, &mut n);
        assert_eq!(s, rkv_status::RKV_OK);
        let mut got = out[..n].to_vec();
        got.sort_by_key(|s| s.worker.worker_id);
        assert_eq!(got, [score(1, 3, 3), score(2, 1, 2)]);
        let st = stats(r);
        assert_eq!((st.workers, st.blocks, st.memberships, st.refused), (2, 3, 5, 0));
        assert_eq!(st.events, 5);
        // A hole: worker 1's middle block removed stops it there.
        assert_eq!(rkv_router_removed(r, a, [101u64].as_ptr(), 1, 0), rkv_status::RKV_OK);
        assert_eq!(find(r, &q), [score(1, 1, 1), score(2, 1, 2)]);
        // Cleared: worker 2 holds nothing, keeps its registration.
        assert_eq!(rkv_router_cleared(r, b), rkv_status::RKV_OK);
        assert_eq!(find(r, &q), [score(1, 1, 1)]);
        assert_eq!(stats(r).workers, 2);
        // An unknown worker holds nothing already.
        assert_eq!(rkv_router_cleared(r, w(9, 0)), rkv_status::RKV_OK);
        assert_eq!(rkv_router_remove_worker(r, a), rkv_status::RKV_OK);
        assert_eq!(rkv_router_remove_worker(r, b), rkv_status::RKV_OK);
        assert!(find(r, &q).is_empty());
        let st = stats(r);
        assert_eq!((st.workers, st.blocks, st.memberships), (0, 0, 0));
        rkv_router_free(r);
    }
}

#[test]
fn namespaces_are_separate() {
    let r = new_router(opts(rkv_gap_policy::RKV_GAP_CLEAR));
    let t = toks(0, 2);
    // SAFETY: every pointer points to a live local of the stated length.
    unsafe {
        let s = rkv_router_stored(
            r,
            w(1, 0),
            c"lora-a".as_ptr(),
            null(),
            null(),
            [1u64, 2].as_ptr(),
            2,
            t.as_ptr(),
            0,
        );
        assert_eq!(s, rkv_status::RKV_OK);
        assert!(find(r, &t).is_empty());
        let mut out = [rkv_router_score::default(); 2];
        let mut n = 0;
        let s = rkv_router_find(
            r,
            t.as_ptr(),
            t.len(),
            c"lora-a".as_ptr(),
            null(),
            out.as_mut_ptr(),
            2,
            &mut n,
        );
        assert_eq!((s, n, out[0]), (rkv_status::RKV_OK, 1, score(1, 2, 2)));
        let s = rkv_router_find(
            r,
            t.as_ptr(),
            t.len(),
            c"lora-a".as_ptr(),
            c"salt".as_ptr(),
            out.as_mut_ptr(),
            2,
            &mut n,
        );
        assert_eq!((s, n), (rkv_status::RKV_OK, 0));
        rkv_router_free(r);
    }
}

#[test]
fn bad_typed_events_are_refused() {
    let r = new_router(opts(rkv_gap_policy::RKV_GAP_CLEAR));
    let t = toks(0, 2);
    let h = [1u64, 2];
    let bad_utf8 = [b'a' as c_char, 0xff_u8 as c_char, 0];
    // SAFETY: every pointer points to a live local of the stated length (or is NULL, or
    // dangling with a length refused before any read, on purpose).
    unsafe {
        use rkv_status::*;
        let st = |r, wk, lora, salt, parent, hp, n, tp, m| {
            rkv_router_stored(r, wk, lora, salt, parent, hp, n, tp, m)
        };
        check(
            st(null(), w(1, 0), null(), null(), null(), h.as_ptr(), 2, t.as_ptr(), 0),
            RKV_NULL_ARGUMENT,
            &["rkv_router_stored: r is NULL"],
        );
        check(
            st(
                r,
                rkv_worker { reserved: 3, ..w(1, 0) },
                null(),
                null(),
                null(),
                h.as_ptr(),
                2,
                t.as_ptr(),
                0,
            ),
            RKV_INVALID_ARGUMENT,
            &["w.reserved = 3 must be 0"],
        );
        check(
            st(r, w(1, 0), null(), null(), null(), h.as_ptr(), 2, t.as_ptr(), 2),
            RKV_INVALID_ARGUMENT,
            &["medium = 2 is not an rkv_medium"],
        );
        check(
            st(r, w(1, 0), bad_utf8.as_ptr(), null(), null(), h.as_ptr(), 2, t.as_ptr(), 0),
            RKV_INVALID_ARGUMENT,
            &["lora_name is not valid UTF-8 (the first bad byte is at 1)"],
        );
        check(
            st(r, w(1, 0), null(), bad_utf8.as_ptr(), null(), h.as_ptr(), 2, t.as_ptr(), 0),
            RKV_INVALID_ARGUMENT,
            &["cache_salt is not valid UTF-8"],
        );
        check(
            st(r, w(1, 0), null(), null(), null(), null(), 2, t.as_ptr(), 0),
            RKV_NULL_ARGUMENT,
            &["block_hashes is NULL but n = 2"],
        );
        check(
            st(r, w(1, 0), null(), null(), null(), h.as_ptr(), 2, null(), 0),
            RKV_NULL_ARGUMENT,
            &["token_ids is NULL but n * block_size = 8"],
        );
        check(
            st(r, w(1, 0), null(), null(), null(), null(), 0, null(), 0),
            RKV_INVALID_ARGUMENT,
            &["store with no blocks"],
        );
        let huge = usize::MAX / 4;
        let dangling = std::ptr::NonNull::<u64>::dangling().as_ptr();
        check(
            st(r, w(1, 0), null(), null(), null(), dangling, huge, t.as_ptr(), 0),
            RKV_INVALID_ARGUMENT,
            &["too large"],
        );
        let misaligned = (h.as_ptr() as *const u8).add(1).cast::<u64>();
        check(
            st(r, w(1, 0), null(), null(), misaligned, h.as_ptr(), 2, t.as_ptr(), 0),
            RKV_INVALID_ARGUMENT,
            &["parent = ", "not aligned"],
        );
        assert_eq!(stats(r).workers, 0, "nothing registered by the argument refusals");
        // An unknown parent: nothing held (the worker is registered).
        check(
            st(r, w(1, 0), null(), null(), &42, h.as_ptr(), 2, t.as_ptr(), 0),
            RKV_INVALID_ARGUMENT,
            &["parent 0x2a", "does not hold"],
        );
        let s = stats(r);
        assert_eq!((s.blocks, s.memberships, s.refused), (0, 0, 2));
        // Removals: unknown worker, unknown hash (the held one goes), bad medium.
        check(
            rkv_router_removed(r, w(5, 0), h.as_ptr(), 2, 0),
            RKV_INVALID_ARGUMENT,
            &["2 removed hashes were not held"],
        );
        assert_eq!(store(r, w(1, 0), None, &h, &t), RKV_OK);
        check(
            rkv_router_removed(r, w(1, 0), [2u64, 77].as_ptr(), 2, 0),
            RKV_INVALID_ARGUMENT,
            &["1 removed hashes", "the held ones were removed"],
        );
        assert_eq!(find(r, &t), [score(1, 1, 1)]);
        check(
            rkv_router_removed(r, w(1, 0), h.as_ptr(), 1, 1),
            RKV_INVALID_ARGUMENT,
            &["not held in that medium"],
        );
        check(
            rkv_router_removed(r, w(1, 0), h.as_ptr(), 1, 7),
            RKV_INVALID_ARGUMENT,
            &["medium = 7"],
        );
        check(
            rkv_router_removed(r, w(1, 0), null(), 1, 0),
            RKV_NULL_ARGUMENT,
            &["block_hashes is NULL"],
        );
        assert_eq!(rkv_router_removed(r, w(1, 0), null(), 0, 0), RKV_OK);
        assert_eq!(find(r, &t), [score(1, 1, 1)]);
        check(rkv_router_cleared(null(), w(1, 0)), RKV_NULL_ARGUMENT, &["r is NULL"]);
        check(
            rkv_router_cleared(r, rkv_worker { reserved: 1, ..w(1, 0) }),
            RKV_INVALID_ARGUMENT,
            &["w.reserved"],
        );
        check(rkv_router_remove_worker(r, w(5, 0)), RKV_NOT_FOUND, &["worker 5/0 is not known"]);
        check(rkv_router_remove_worker(null(), w(5, 0)), RKV_NULL_ARGUMENT, &["r is NULL"]);
        check(
            rkv_router_remove_worker(r, rkv_worker { reserved: 1, ..w(1, 0) }),
            RKV_INVALID_ARGUMENT,
            &["w.reserved"],
        );
        assert_eq!(find(r, &t), [score(1, 1, 1)]);
        rkv_router_free(r);
    }
}

#[test]
fn too_many_workers() {
    let r =
        new_router(rkv_router_options { max_workers: 1, ..opts(rkv_gap_policy::RKV_GAP_CLEAR) });
    let t = toks(0, 1);
    assert_eq!(store(r, w(1, 0), None, &[1], &t), rkv_status::RKV_OK);
    check(
        store(r, w(1, 1), None, &[1], &t),
        rkv_status::RKV_INVALID_ARGUMENT,
        &["1 workers are live already", "larger max_workers"],
    );
    assert_eq!(find(r, &t), [score(1, 1, 1)]);
    // SAFETY: `r` is live.
    unsafe { rkv_router_free(r) };
}

#[test]
fn find_bad_inputs_and_small_buffers() {
    let r = new_router(opts(rkv_gap_policy::RKV_GAP_CLEAR));
    let t = toks(0, 2);
    assert_eq!(store(r, w(1, 0), None, &[1, 2], &t), rkv_status::RKV_OK);
    assert_eq!(store(r, w(2, 0), None, &[1], &toks(0, 1)), rkv_status::RKV_OK);
    let bad_utf8 = [0xc3_u8 as c_char, 0];
    // SAFETY: every pointer points to a live local of the stated length (or is NULL on
    // purpose).
    unsafe {
        use rkv_status::*;
        let keep = rkv_router_score { device_blocks: 77, ..Default::default() };
        let mut out = [keep; 2];
        let mut n = 99;
        check(
            rkv_router_find(r, t.as_ptr(), t.len(), null(), null(), out.as_mut_ptr(), 1, &mut n),
            RKV_BUFFER_TOO_SMALL,
            &["cap = 1 is smaller than the 2 scores (*out_len = 2)"],
        );
        assert_eq!((n, out), (2, [keep; 2]), "only *out_len written");
        n = 99;
        check(
            rkv_router_find(r, t.as_ptr(), t.len(), null(), null(), null_mut(), 0, &mut n),
            RKV_BUFFER_TOO_SMALL,
            &["cap = 0"],
        );
        assert_eq!(n, 2);
        // No match, a NULL buffer with cap 0: RKV_OK with 0 scores.
        let other = toks(5, 1);
        assert_eq!(
            rkv_router_find(r, other.as_ptr(), other.len(), null(), null(), null_mut(), 0, &mut n),
            RKV_OK
        );
        assert_eq!(n, 0);
        assert_eq!(rkv_router_find(r, null(), 0, null(), null(), null_mut(), 0, &mut n), RKV_OK);
        assert_eq!(n, 0);
        n = 99;
        check(
            rkv_router_find(
                null(),
                t.as_ptr(),
                t.len(),
                null(),
                null(),
                out.as_mut_ptr(),
                2,
                &mut n,
            ),
            RKV_NULL_ARGUMENT,
            &["rkv_router_find: r is NULL"],
        );
        check(
            rkv_router_find(r, null(), 3, null(), null(), out.as_mut_ptr(), 2, &mut n),
            RKV_NULL_ARGUMENT,
            &["tokens is NULL but n_tokens = 3"],
        );
        check(
            rkv_router_find(r, t.as_ptr(), t.len(), null(), null(), null_mut(), 2, &mut n),
            RKV_NULL_ARGUMENT,
            &["out is NULL but cap = 2"],
        );
        check(
            rkv_router_find(
                r,
                t.as_ptr(),
                t.len(),
                null(),
                null(),
                out.as_mut_ptr(),
                2,
                null_mut(),
            ),
            RKV_NULL_ARGUMENT,
            &["out_len is NULL"],
        );
        check(
            rkv_router_find(
                r,
                t.as_ptr(),
                t.len(),
                bad_utf8.as_ptr(),
                null(),
                out.as_mut_ptr(),
                2,
                &mut n,
            ),
            RKV_INVALID_ARGUMENT,
            &["lora_name is not valid UTF-8"],
        );
        check(
            rkv_router_find_hashes(r, null(), 1, out.as_mut_ptr(), 2, &mut n),
            RKV_NULL_ARGUMENT,
            &["content_hashes is NULL"],
        );
        check(
            rkv_router_find_hashes(r, [1u64].as_ptr(), 1, out.as_mut_ptr(), 2, null_mut()),
            RKV_NULL_ARGUMENT,
            &["out_len is NULL"],
        );
        assert_eq!((n, out), (99, [keep; 2]));
        let mut s = rkv_router_stats::default();
        check(rkv_router_stats_get(null(), &mut s), RKV_NULL_ARGUMENT, &["r is NULL"]);
        check(rkv_router_stats_get(r, null_mut()), RKV_NULL_ARGUMENT, &["out is NULL"]);
        let mut seq = 5;
        check(
            rkv_router_next_seq(r, w(1, 0), null_mut()),
            RKV_NULL_ARGUMENT,
            &["out_next is NULL"],
        );
        check(rkv_router_next_seq(null(), w(1, 0), &mut seq), RKV_NULL_ARGUMENT, &["r is NULL"]);
        check(
            rkv_router_next_seq(r, rkv_worker { reserved: 2, ..w(1, 0) }, &mut seq),
            RKV_INVALID_ARGUMENT,
            &["w.reserved = 2"],
        );
        // Typed events set no cursor; an unknown worker has none.
        check(
            rkv_router_next_seq(r, w(1, 0), &mut seq),
            RKV_NOT_FOUND,
            &["worker 1/0 has no batch cursor"],
        );
        check(
            rkv_router_next_seq(r, w(3, 0), &mut seq),
            RKV_NOT_FOUND,
            &["worker 3/0 has no batch cursor"],
        );
        assert_eq!(seq, 5);
        rkv_router_free(r);
    }
}

#[test]
fn batches_apply_and_bad_payloads_are_refused_whole() {
    let r = new_router(opts(rkv_gap_policy::RKV_GAP_CLEAR));
    let q = toks(0, 3);
    let p0 = payload(vec![stored_event(None, &[10, 11], toks(0, 2))], 0);
    assert_eq!(apply(r, 1, 0, &p0), rkv_status::RKV_OK);
    // The payload's data_parallel_rank names the worker.
    let p1 = payload(vec![stored_event(None, &[20], toks(0, 1))], 3);
    assert_eq!(apply(r, 1, 0, &p1), rkv_status::RKV_OK);
    assert_eq!(next_seq(r, w(1, 0)), Some(1));
    assert_eq!(next_seq(r, w(1, 3)), Some(1));
    let mut got = find(r, &q);
    got.sort_by_key(|s| s.worker.dp_rank);
    assert_eq!(
        got,
        [score(1, 2, 2), rkv_router_score { worker: w(1, 3), device_blocks: 1, any_blocks: 1 }]
    );
    let before = dump(r);
    let st0 = stats(r);
    // Malformed payloads: refused whole, counted, the index unchanged.
    let mut truncated = payload(vec![stored_event(Some(11), &[12], toks(2, 1))], 0);
    truncated.truncate(truncated.len() - 3);
    for bad in [&b"\xc1garbage"[..], &[], &[0x93, 0x01], &truncated[..]] {
        check(
            apply(r, 1, 1, bad),
            rkv_status::RKV_INVALID_ARGUMENT,
            &["rkv_router_apply_batch: malformed KV-event batch"],
        );
    }
    let bad_rank = payload(vec![], -1);
    check(apply(r, 1, 1, &bad_rank), rkv_status::RKV_INVALID_ARGUMENT, &["data_parallel_rank -1"]);
    // SAFETY: NULL with a length, refused before any read; a NULL index.
    unsafe {
        check(
            rkv_router_apply_batch(r, 1, 1, null(), 4),
            rkv_status::RKV_NULL_ARGUMENT,
            &["payload is NULL but len = 4"],
        );
        check(
            rkv_router_apply_batch(null(), 1, 1, p0.as_ptr(), p0.len()),
            rkv_status::RKV_NULL_ARGUMENT,
            &["r is NULL"],
        );
    }
    assert_eq!(dump(r), before);
    assert_eq!(next_seq(r, w(1, 0)), Some(1));
    let st1 = stats(r);
    assert_eq!(st1.refused, st0.refused + 5);
    assert_eq!(
        (st1.blocks, st1.memberships, st1.workers),
        (st0.blocks, st0.memberships, st0.workers)
    );
    // An event refused for its content (tokens not n * block_size, an unknown parent) is
    // counted and skipped; the others apply and the call succeeds.
    let mixed = payload(
        vec![
            stored_event(Some(11), &[12], toks(2, 1)[..3].to_vec()),
            stored_event(Some(999), &[13], toks(2, 1)),
            stored_event(Some(11), &[12], toks(2, 1)),
        ],
        0,
    );
    assert_eq!(apply(r, 1, 1, &mixed), rkv_status::RKV_OK);
    assert_eq!(stats(r).refused, st1.refused + 2);
    assert_eq!(find(r, &q)[0], score(1, 3, 3));
    // A restart (seq below the cursor) clears the worker first.
    let again = payload(vec![stored_event(None, &[10], toks(0, 1))], 0);
    assert_eq!(apply(r, 1, 0, &again), rkv_status::RKV_OK);
    assert_eq!(find(r, &q)[0], score(1, 1, 1));
    assert_eq!((stats(r).restarts, next_seq(r, w(1, 0))), (1, Some(1)));
    // Under RKV_GAP_CLEAR a gap clears the worker, then the batch applies.
    let later = payload(vec![stored_event(None, &[30, 31], toks(0, 2))], 0);
    assert_eq!(apply(r, 1, 5, &later), rkv_status::RKV_OK);
    assert_eq!(find(r, &q)[0], score(1, 2, 2));
    assert_eq!((stats(r).gaps, next_seq(r, w(1, 0))), (1, Some(6)));
    // SAFETY: `r` is live.
    unsafe { rkv_router_free(r) };
}

#[test]
fn a_gap_under_refuse_applies_nothing_until_replayed() {
    let r = new_router(opts(rkv_gap_policy::RKV_GAP_REFUSE));
    let q = toks(0, 3);
    let b0 = payload(vec![stored_event(None, &[10], toks(0, 1))], 0);
    let b1 = payload(vec![stored_event(Some(10), &[11], toks(1, 1))], 0);
    let b2 = payload(vec![stored_event(Some(11), &[12], toks(2, 1))], 0);
    assert_eq!(apply(r, 1, 0, &b0), rkv_status::RKV_OK);
    let before = dump(r);
    check(
        apply(r, 1, 2, &b2),
        rkv_status::RKV_SEQUENCE_GAP,
        &[
            "sequence gap for worker 1/0: expected seq 1, got 2",
            "replay the worker's batches from seq 1",
        ],
    );
    assert_eq!(dump(r), before, "nothing applied");
    assert_eq!(find(r, &q), [score(1, 1, 1)]);
    let s = stats(r);
    assert_eq!((s.gaps, s.refused), (1, 1));
    // next_seq says where to replay from; the replay then the retry apply.
    assert_eq!(next_seq(r, w(1, 0)), Some(1));
    assert_eq!(apply(r, 1, 1, &b1), rkv_status::RKV_OK);
    assert_eq!(apply(r, 1, 2, &b2), rkv_status::RKV_OK);
    assert_eq!(find(r, &q), [score(1, 3, 3)]);
    assert_eq!(next_seq(r, w(1, 0)), Some(3));
    // SAFETY: `r` is live.
    unsafe { rkv_router_free(r) };
}

#[test]
fn dump_restores_an_equal_index() {
    let o = opts(rkv_gap_policy::RKV_GAP_CLEAR);
    let r = new_router(o);
    assert_eq!(store(r, w(1, 0), None, &[100, 101, 102], &toks(0, 3)), rkv_status::RKV_OK);
    assert_eq!(store(r, w(2, 0), None, &[7, 8], &toks(0, 2)), rkv_status::RKV_OK);
    // SAFETY: every pointer points to a live local of the stated length.
    unsafe {
        let t = toks(1, 1);
        let s =
            rkv_router_stored(r, w(2, 0), null(), null(), &7, [8u64].as_ptr(), 1, t.as_ptr(), 1);
        assert_eq!(s, rkv_status::RKV_OK);
        assert_eq!(rkv_router_removed(r, w(2, 0), [8u64].as_ptr(), 1, 0), rkv_status::RKV_OK);
    }
    let p = payload(vec![stored_event(None, &[5], toks(3, 1))], 0);
    assert_eq!(apply(r, 3, 41, &p), rkv_status::RKV_OK);
    let bytes = dump(r);
    assert_eq!(&bytes[..8], b"RKVRDUMP");
    let mut back = null_mut();
    // SAFETY: every pointer points to a live local of the stated length (or is NULL on
    // purpose).
    unsafe {
        use rkv_status::*;
        assert_eq!(rkv_router_restore(&o, bytes.as_ptr(), bytes.len(), &mut back), RKV_OK);
        for q in [toks(0, 4), toks(3, 1), toks(1, 2)] {
            assert_eq!(find(back, &q), find(r, &q));
        }
        assert_eq!(find(back, &toks(0, 4)), [score(1, 3, 3), score(2, 1, 2)]);
        assert_eq!(next_seq(back, w(3, 0)), Some(42));
        assert_eq!(next_seq(back, w(1, 0)), None);
        let (a, b) = (stats(r), stats(back));
        assert_eq!((a.workers, a.blocks, a.memberships), (b.workers, b.blocks, b.memberships));
        assert_eq!(dump(back), bytes);
        // A small buffer: only *out_len.
        let mut small = [0xaau8; 8];
        let mut n = 0;
        check(
            rkv_router_dump(r, small.as_mut_ptr(), 8, &mut n),
            RKV_BUFFER_TOO_SMALL,
            &["cap = 8 is smaller than the dump"],
        );
        assert_eq!((n, small), (bytes.len(), [0xaa; 8]));
        check(
            rkv_router_dump(r, null_mut(), 4, &mut n),
            RKV_NULL_ARGUMENT,
            &["out is NULL but cap = 4"],
        );
        check(
            rkv_router_dump(r, small.as_mut_ptr(), 8, null_mut()),
            RKV_NULL_ARGUMENT,
            &["out_len is NULL"],
        );
        check(
            rkv_router_dump(null(), small.as_mut_ptr(), 8, &mut n),
            RKV_NULL_ARGUMENT,
            &["r is NULL"],
        );
        // Bad restores: nothing created.
        let sentinel = std::ptr::dangling_mut::<rkv_router>();
        let mut x = sentinel;
        let mut bad = |b: &[u8], o: &rkv_router_options, msg: &str| {
            check(rkv_router_restore(o, b.as_ptr(), b.len(), &mut x), RKV_INVALID_ARGUMENT, &[msg]);
            assert_eq!(x, sentinel);
        };
        bad(&bytes[..bytes.len() - 1], &o, "bytes are not a router dump: ");
        bad(&bytes[..3], &o, "truncated at byte 0 of 3");
        bad(&[], &o, "truncated");
        let mut extra = bytes.clone();
        extra.push(0);
        bad(&extra, &o, "1 bytes follow the last worker");
        let mut magic = bytes.clone();
        magic[0] = b'X';
        bad(&magic, &o, "do not start with \"RKVRDUMP\"");
        let mut version = bytes.clone();
        version[8] = 3;
        bad(&version, &o, "format version 3; this library reads versions 1 and 2");
        bad(
            &bytes,
            &rkv_router_options { block_size: 8, ..o },
            "block_size 4, but opts->block_size = 8",
        );
        bad(&bytes, &rkv_router_options { max_workers: 2, ..o }, "2 workers are live already");
        bad(&bytes, &rkv_router_options { reserved: 1, ..o }, "opts->reserved");
        let mut media = bytes.clone();
        // The first block's media field: header 24, worker 40 (no groups), then hash 8 and
        // key 8.
        media[24 + 40 + 16] = 0;
        bad(&media, &o, "media = 0");
        let mut count = bytes.clone();
        count[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        bad(&count, &o, "n_workers = 18446744073709551615 does not fit");
        check(
            rkv_router_restore(null(), bytes.as_ptr(), bytes.len(), &mut x),
            RKV_NULL_ARGUMENT,
            &["opts is NULL"],
        );
        check(
            rkv_router_restore(&o, null(), 5, &mut x),
            RKV_NULL_ARGUMENT,
            &["bytes is NULL but len = 5"],
        );
        check(
            rkv_router_restore(&o, bytes.as_ptr(), bytes.len(), null_mut()),
            RKV_NULL_ARGUMENT,
            &["out is NULL"],
        );
        assert_eq!(x, sentinel);
        // An empty index dumps to a header that restores to an empty index.
        let e = new_router(o);
        let eb = dump(e);
        assert_eq!(eb.len(), 24);
        let mut e2 = null_mut();
        assert_eq!(rkv_router_restore(&o, eb.as_ptr(), eb.len(), &mut e2), RKV_OK);
        assert_eq!(stats(e2).workers, 0);
        rkv_router_free(e2);
        rkv_router_free(e);
        rkv_router_free(back);
        rkv_router_free(r);
    }
}

#[test]
fn every_router_error_maps_to_its_status() {
    let wk = radixkv_router::Worker::new(1, 0);
    let cases = [
        (
            RouterError::InvalidOptions { block_size: 0, max_workers: 1 },
            rkv_status::RKV_INVALID_ARGUMENT,
        ),
        (RouterError::Malformed { reason: "x".into() }, rkv_status::RKV_INVALID_ARGUMENT),
        (
            RouterError::SequenceGap { worker: wk, expected: 1, got: 3 },
            rkv_status::RKV_SEQUENCE_GAP,
        ),
        (RouterError::UnknownParent { parent: 1 }, rkv_status::RKV_INVALID_ARGUMENT),
        (RouterError::UnknownRemovals { count: 1 }, rkv_status::RKV_INVALID_ARGUMENT),
        (
            RouterError::Unaligned { blocks: 1, tokens: 3, block_size: 4, expected: 4 },
            rkv_status::RKV_INVALID_ARGUMENT,
        ),
        (RouterError::Empty, rkv_status::RKV_INVALID_ARGUMENT),
        (RouterError::TooManyWorkers { max_workers: 1 }, rkv_status::RKV_INVALID_ARGUMENT),
        (RouterError::BadDump { worker: wk }, rkv_status::RKV_INVALID_ARGUMENT),
    ];
    for (e, want) in cases {
        assert_eq!(router_status_code(&e), want as i32, "{e}");
        assert_eq!(router_fail(e).status, want);
    }
    // The new statuses are the core's table's.
    assert_eq!(rkv_status::RKV_SEQUENCE_GAP as i32, 11);
    assert_eq!(rkv_status::RKV_NOT_FOUND as i32, 12);
}

#[test]
fn finds_from_many_threads_while_workers_apply() {
    let r = new_router(opts(rkv_gap_policy::RKV_GAP_CLEAR));
    let addr = r as usize;
    let q = toks(0, 4);
    std::thread::scope(|s| {
        for id in 1..=4u64 {
            s.spawn(move || {
                let r = addr as *const rkv_router;
                for round in 0..50u64 {
                    let p = payload(vec![stored_event(None, &[1, 2, 3, 4], toks(0, 4))], 0);
                    assert_eq!(apply(r, id, round, &p), rkv_status::RKV_OK);
                    let wk = w(id, 0);
                    // SAFETY: `r` is live for the scope; the array is a live local.
                    unsafe {
                        assert_eq!(
                            rkv_router_removed(r, wk, [3u64, 4].as_ptr(), 2, 0),
                            rkv_status::RKV_OK
                        )
                    };
                }
            });
        }
        for _ in 0..2 {
            let q = q.clone();
            s.spawn(move || {
                let r = addr as *const rkv_router;
                for _ in 0..200 {
                    for sc in find(r, &q) {
                        assert!(
                            sc.any_blocks >= 1
                                && sc.any_blocks <= 4
                                && sc.device_blocks <= sc.any_blocks
                        );
                    }
                }
            });
        }
    });
    assert_eq!(find(r, &q), (1..=4).map(|i| score(i, 2, 2)).collect::<Vec<_>>());
    // SAFETY: every thread is done.
    unsafe { rkv_router_free(r) };
}

/// The batch `tests/c/test_router.c` and `tests/cpp/test_router.cpp` embed as bytes: one
/// `BlockStored` of engine hashes 0xA0, 0xA1 with tokens 1..=8 (block size 4), no parent,
/// plain namespace, GPU; ts 1.0, data_parallel_rank 0 (vLLM's array encoding).
#[test]
fn the_c_tests_payload_is_this_batch() {
    #[rustfmt::skip]
    const C_PAYLOAD: [u8; 65] = [
        0x93, 0xcb, 0x3f, 0xf0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x91, 0x9c, 0xab, 0x42, 0x6c,
        0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x92, 0xcc, 0xa0, 0xcc, 0xa1, 0xc0,
        0x98, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x04, 0xc0, 0xa3, 0x47, 0x50, 0x55,
        0xc0, 0xc0, 0x00, 0xae, 0x66, 0x75, 0x6c, 0x6c, 0x5f, 0x61, 0x74, 0x74, 0x65, 0x6e, 0x74,
        0x69, 0x6f, 0x6e, 0xc0, 0x00,
    ];
    let p = payload(vec![stored_event(None, &[0xA0, 0xA1], (1..=8).collect())], 0);
    assert_eq!(p, C_PAYLOAD);
    let r = new_router(opts(rkv_gap_policy::RKV_GAP_CLEAR));
    assert_eq!(apply(r, 7, 0, &C_PAYLOAD), rkv_status::RKV_OK);
    assert_eq!(find(r, &(1..=8).collect::<Vec<_>>()), [score(7, 2, 2)]);
    // SAFETY: `r` is live.
    unsafe { rkv_router_free(r) };
}

mod groups;
