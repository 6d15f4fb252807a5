//! KV cache groups through the C ABI: `rkv_router_stats_get_ex` (its `other_groups`, every
//! bad input) and the sliding-window batch the C test embeds.

use radixkv_core::events::wire::{KvCacheSpecKind, KvGroup};

use super::*;

/// A batch of `events` published by a cache of group `group_idx` of `kind` (`window`).
fn group_payload(
    events: Vec<KvEvent>,
    group_idx: u32,
    kind: KvCacheSpecKind,
    window: Option<u32>,
) -> Vec<u8> {
    let group = KvGroup::new(group_idx, kind, window).unwrap();
    let o = WireOptions { group, ..WireOptions::default() };
    encode_batch(&EventBatch { ts: 1.0, events }, &o)
}

fn stats_ex(r: *const rkv_router) -> rkv_router_stats_ex {
    let mut s =
        rkv_router_stats_ex { size: size_of::<rkv_router_stats_ex>() as u32, ..Default::default() };
    // SAFETY: `s` is a live local of its stated size.
    let st = unsafe { rkv_router_stats_get_ex(r, &mut s) };
    assert_eq!(st, rkv_status::RKV_OK, "{}", last());
    s
}

#[test]
fn stats_ex_counts_other_groups_and_repeats_the_rest() {
    let r = new_router(opts(rkv_gap_policy::RKV_GAP_CLEAR));
    let t: Vec<u32> = (1..=8).collect();
    let full = payload(vec![stored_event(None, &[0xA0, 0xA1], t.clone())], 0);
    let sliding = group_payload(
        vec![stored_event(None, &[0xB0, 0xB1], t.clone())],
        1,
        KvCacheSpecKind::SlidingWindow,
        Some(4),
    );
    let removal = group_payload(
        vec![KvEvent::BlockRemoved { block_hashes: vec![0xA1], medium: Medium::Gpu }],
        1,
        KvCacheSpecKind::SlidingWindow,
        Some(4),
    );
    assert_eq!(apply(r, 7, 0, &full), rkv_status::RKV_OK);
    assert_eq!(stats_ex(r).other_groups, 0);
    assert_eq!(apply(r, 7, 1, &sliding), rkv_status::RKV_OK);
    // A removal of group 1 (its store taught: sliding window) is skipped too, even of a
    // hash the full group holds.
    assert_eq!(apply(r, 7, 2, &removal), rkv_status::RKV_OK);
    assert_eq!(find(r, &t), [score(7, 2, 2)]);
    let ex = stats_ex(r);
    let s = stats(r);
    assert_eq!((ex.size, ex.reserved, ex.other_groups), (88, 0, 2));
    let base = rkv_router_stats {
        workers: ex.workers,
        blocks: ex.blocks,
        memberships: ex.memberships,
        bytes: ex.bytes,
        events: ex.events,
        batches: ex.batches,
        gaps: ex.gaps,
        restarts: ex.restarts,
        refused: ex.refused,
    };
    assert_eq!(base, s);
    assert_eq!((s.workers, s.blocks, s.events, s.batches, s.refused), (1, 2, 3, 3, 0));

    // A caller built against a later, larger struct: this library's fields, `size` set to
    // the bytes written, the rest left alone.
    #[repr(C)]
    struct Later {
        ex: rkv_router_stats_ex,
        added: u64,
    }
    let mut later = Later {
        ex: rkv_router_stats_ex { size: size_of::<Later>() as u32, ..Default::default() },
        added: 0x5eed,
    };
    // SAFETY: `later` is a live local of the size it states.
    let st = unsafe { rkv_router_stats_get_ex(r, &mut later.ex) };
    assert_eq!(st, rkv_status::RKV_OK, "{}", last());
    assert_eq!((later.ex, later.added), (ex, 0x5eed));
    // SAFETY: `r` is live.
    unsafe { rkv_router_free(r) };
}

#[test]
fn stats_ex_bad_inputs_write_nothing() {
    use rkv_status::*;
    let r = new_router(opts(rkv_gap_policy::RKV_GAP_CLEAR));
    let keep = rkv_router_stats_ex {
        size: 88,
        reserved: 0x77,
        workers: 0x99,
        other_groups: 0x99,
        ..Default::default()
    };
    // SAFETY: every pointer is a live local, NULL, or misaligned on purpose (refused before
    // any access).
    unsafe {
        let mut s = keep;
        check(rkv_router_stats_get_ex(null(), &mut s), RKV_NULL_ARGUMENT, &["r is NULL"]);
        assert_eq!(s, keep);
        check(
            rkv_router_stats_get_ex(r, null_mut()),
            RKV_NULL_ARGUMENT,
            &["rkv_router_stats_get_ex", "out is NULL"],
        );
        for size in [0u32, 4, 72, 87] {
            let mut s = rkv_router_stats_ex { size, ..keep };
            check(
                rkv_router_stats_get_ex(r, &mut s),
                RKV_INVALID_ARGUMENT,
                &[&format!("out->size = {size} is smaller than an rkv_router_stats_ex (88)")],
            );
            assert_eq!(s, rkv_router_stats_ex { size, ..keep }, "nothing written");
        }
        let mut buf = [0u64; 12];
        let misaligned = buf.as_mut_ptr().cast::<u8>().add(4).cast::<rkv_router_stats_ex>();
        check(rkv_router_stats_get_ex(r, misaligned), RKV_INVALID_ARGUMENT, &["not aligned"]);
        assert_eq!(buf, [0; 12]);
        // A call that succeeds clears the message.
        let mut s = keep;
        assert_eq!(rkv_router_stats_get_ex(r, &mut s), RKV_OK);
        assert_eq!(last(), "");
        assert_eq!((s.size, s.reserved, s.workers, s.other_groups), (88, 0, 0, 0));
        rkv_router_free(r);
    }
}

/// The sliding-window batch `tests/c/test_router.c` embeds (`BATCH_SW`): `C_PAYLOAD` of
/// `the_c_tests_payload_is_this_batch` with engine hashes 0xB0, 0xB1 published by group 1,
/// `"sliding_window"`, window 4.
#[test]
fn the_c_tests_sliding_window_payload_is_this_batch() {
    #[rustfmt::skip]
    const C_PAYLOAD_SW: [u8; 65] = [
        0x93, 0xcb, 0x3f, 0xf0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x91, 0x9c, 0xab, 0x42, 0x6c,
        0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x92, 0xcc, 0xb0, 0xcc, 0xb1, 0xc0,
        0x98, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x04, 0xc0, 0xa3, 0x47, 0x50, 0x55,
        0xc0, 0xc0, 0x01, 0xae, 0x73, 0x6c, 0x69, 0x64, 0x69, 0x6e, 0x67, 0x5f, 0x77, 0x69, 0x6e,
        0x64, 0x6f, 0x77, 0x04, 0x00,
    ];
    let p = group_payload(
        vec![stored_event(None, &[0xB0, 0xB1], (1..=8).collect())],
        1,
        KvCacheSpecKind::SlidingWindow,
        Some(4),
    );
    assert_eq!(p, C_PAYLOAD_SW);
    let r = new_router(opts(rkv_gap_policy::RKV_GAP_CLEAR));
    assert_eq!(apply(r, 7, 0, &C_PAYLOAD_SW), rkv_status::RKV_OK);
    assert!(find(r, &(1..=8).collect::<Vec<_>>()).is_empty());
    assert_eq!(stats_ex(r).other_groups, 1);
    // SAFETY: `r` is live.
    unsafe { rkv_router_free(r) };
}

/// A removal (no kind, as vLLM sends it) of `hashes` by group `group_idx`.
fn group_removal(hashes: &[u64], group_idx: u32) -> Vec<u8> {
    let ev = KvEvent::BlockRemoved { block_hashes: hashes.to_vec(), medium: Medium::Gpu };
    group_payload(vec![ev], group_idx, KvCacheSpecKind::FullAttention, None)
}

/// Version 1 of `v2` (a version-2 dump): what a library before groups were saved wrote for
/// the same index, its workers without `n_groups` and groups.
fn as_version_1(v2: &[u8]) -> Vec<u8> {
    let u64_at = |at: usize| u64::from_le_bytes(v2[at..at + 8].try_into().unwrap());
    let mut v1 = v2[..24].to_vec();
    v1[8..12].copy_from_slice(&1u32.to_le_bytes());
    let mut at = 24;
    for _ in 0..u64_at(16) {
        let (nb, ng) = (u64_at(at + 24) as usize, u64_at(at + 32) as usize);
        v1.extend_from_slice(&v2[at..at + 32]);
        at += 40 + 8 * ng;
        v1.extend_from_slice(&v2[at..at + 24 * nb]);
        at += 24 * nb;
    }
    assert_eq!(at, v2.len());
    v1
}

fn restore(o: &rkv_router_options, bytes: &[u8]) -> *mut rkv_router {
    let mut r = null_mut();
    // SAFETY: every pointer points to a live local of the stated length.
    let st = unsafe { rkv_router_restore(o, bytes.as_ptr(), bytes.len(), &mut r) };
    assert_eq!(st, rkv_status::RKV_OK, "{}", last());
    r
}

/// The dump keeps the group kinds a worker's stores taught (format version 2): after a
/// restore, a removal of group 3 (taught: MLA, main attention) still applies. A version-1
/// dump of the same index still restores, with no kinds learned: that removal is skipped.
#[test]
fn a_dump_keeps_learned_group_kinds_and_version_1_still_restores() {
    use rkv_status::*;
    let o = opts(rkv_gap_policy::RKV_GAP_CLEAR);
    let r = new_router(o);
    let (t, t2) = (toks(0, 2), toks(5, 2));
    let mla = |ev| group_payload(vec![ev], 3, KvCacheSpecKind::MlaAttention, None);
    assert_eq!(apply(r, 7, 0, &payload(vec![stored_event(None, &[1, 2], t.clone())], 0)), RKV_OK);
    assert_eq!(apply(r, 7, 1, &mla(stored_event(None, &[8, 9], t2.clone()))), RKV_OK);
    let bytes = dump(r);
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 2);
    // One worker: n_groups 1, group 3 of kind 1 (main attention), then its 4 blocks.
    assert_eq!(bytes.len(), 24 + 40 + 8 + 4 * 24);
    assert_eq!(&bytes[24 + 32..24 + 48], [1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0]);

    let back = restore(&o, &bytes);
    assert_eq!(dump(back), bytes);
    let old = restore(&o, &as_version_1(&bytes));
    assert_eq!(dump(old), [&bytes[..24 + 32], &[0; 8], &bytes[24 + 48..]].concat());
    for x in [r, back, old] {
        assert_eq!(find(x, &t2), [score(7, 2, 2)]);
        assert_eq!(apply(x, 7, 2, &group_removal(&[9], 3)), RKV_OK);
    }
    assert_eq!(find(r, &t2), [score(7, 1, 1)]);
    assert_eq!(find(back, &t2), [score(7, 1, 1)], "learned kind restored: removal applied");
    assert_eq!(find(old, &t2), [score(7, 2, 2)], "version 1: none learned, removal skipped");
    assert_eq!((stats_ex(r).other_groups, stats_ex(back).other_groups), (0, 0));
    assert_eq!(stats_ex(old).other_groups, 1);
    // A version-1 header alone (an empty index then) restores too.
    let mut v1_empty = b"RKVRDUMP".to_vec();
    v1_empty.extend([1, 0, 0, 0, BS as u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let e = restore(&o, &v1_empty);
    assert_eq!(stats(e).workers, 0);

    // Bad groups: nothing created.
    let sentinel = std::ptr::dangling_mut::<rkv_router>();
    let mut x = sentinel;
    // SAFETY: every pointer points to a live local of the stated length; the routers are
    // live until freed here.
    unsafe {
        let mut bad = |b: &[u8], msg: &str| {
            check(
                rkv_router_restore(&o, b.as_ptr(), b.len(), &mut x),
                RKV_INVALID_ARGUMENT,
                &[msg],
            );
            assert_eq!(x, sentinel);
        };
        let mut kind = bytes.clone();
        kind[24 + 44] = 2;
        bad(&kind, "worker 0's group 0 has kind = 2");
        let mut count = bytes.clone();
        count[24 + 32..24 + 40].copy_from_slice(&u64::MAX.to_le_bytes());
        bad(&count, "worker 0's n_groups = 18446744073709551615 does not fit");
        // Two groups, the second not above the first.
        let mut twice = bytes[..24 + 32].to_vec();
        twice.extend(2u64.to_le_bytes());
        twice.extend([3, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]);
        twice.extend(&bytes[24 + 48..]);
        bad(&twice, "worker 0's group 1 has group_idx = 3, not above the one before it");
        // A version-1 dump read as version 2 (or the reverse) does not parse.
        let mut v1 = as_version_1(&bytes);
        v1[8] = 2;
        bad(&v1, "not a router dump");
        for p in [r, back, old, e] {
            rkv_router_free(p);
        }
    }
}
